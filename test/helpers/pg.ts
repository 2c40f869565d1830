import { SQL } from 'bun'

const ADMIN_URL = process.env.TROPA_TEST_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/test'

/** A new, empty PostgreSQL database for one test file; `drop()` removes it. */
export async function freshPgDatabase(): Promise<{ url: string; drop(): Promise<void> }> {
  const admin = new SQL(ADMIN_URL)
  const name = `tropa_t_${process.pid}_${Date.now().toString(36)}_${Math.floor(Math.random() * 1e6)}`
  await admin.unsafe(`CREATE DATABASE ${name}`)
  const u = new URL(ADMIN_URL)
  u.pathname = `/${name}`
  return {
    url: u.toString(),
    async drop() {
      await admin.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
      await admin.close()
    },
  }
}
