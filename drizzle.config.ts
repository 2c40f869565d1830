import { defineConfig } from 'drizzle-kit'

// `bunx drizzle-kit generate` writes SQL migrations next to the schema; they are embedded in the
// executable through src/storage/sqlite/migrations.ts (add each new file there).
export default defineConfig({
  dialect: 'sqlite',
  schema: './src/storage/sqlite/schema.ts',
  out: './src/storage/sqlite/migrations',
})
