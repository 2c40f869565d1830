// SQL migrations are imported as text (`with { type: 'text' }`) so they live inside the executable.
declare module '*.sql' {
  const text: string
  export default text
}
