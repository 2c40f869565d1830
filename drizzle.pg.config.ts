import { defineConfig } from 'drizzle-kit'

// PostgreSQL migrations (`bunx drizzle-kit generate --config drizzle.pg.config.ts`); embedded
// in the executable through src/storage/postgres/migrations.ts.
export default defineConfig({
  dialect: 'postgresql',
  schema: './src/storage/postgres/schema.ts',
  out: './src/storage/postgres/migrations',
})
