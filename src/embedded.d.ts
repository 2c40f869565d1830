// SQL migrations are imported as text (`with { type: 'text' }`) so they live inside the executable.
declare module '*.sql' {
  const text: string
  export default text
}

// The API reference viewer's files, imported `with { type: 'file' }`: their paths (inside the
// executable, in Bun's embedded file system).
declare module 'swagger-ui-dist/swagger-ui-bundle.js' {
  const path: string
  export default path
}
declare module '*.css' {
  const path: string
  export default path
}

// The console's bundle, written by scripts/build-console.ts and embedded by `bun build --compile`.
declare module '*/dist/console/console.js' {
  const path: string
  export default path
}
