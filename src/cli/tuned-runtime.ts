import { dlopen, FFIType, ptr } from 'bun:ffi'
import { readFileSync } from 'node:fs'

// JavaScriptCore's settings are read from the environment once, when the process starts, and
// cannot be changed from JavaScript after. The one Tropa changes:
//
// `useWarmUpMarkedBlocks` (on by default in Bun 1.4.5) keeps a helper thread, "JSCWarmUp", that
// pre-faults the heap's 16 KB blocks so the main thread need not. Under a router's steady load
// the blocks freed by each young collection go back to the allocator, whose scavenger returns
// their pages to the kernel (madvise), and the helper faults fresh ones in again: on 2 cores the
// two took 20-25 us of CPU per request beside the main thread's 80-90, and with the helper off a
// router served a third more requests a second on a third less CPU per request, paired
// (bench/results/2026-11-28j-jsc-warm-up-thread.md). A bare proxy allocates too little to notice.
//
// So the router, when started without the setting, runs itself again in place (execve: the same
// process id, arguments, standard streams and environment, plus the setting) before it loads
// anything else (cli/tuned-start.ts, main.ts's first import). Setting the variable yourself (to 0
// or 1) is taken as it is, with no second start; the other subcommands never start twice.

/** The JavaScriptCore setting, as Bun reads it from the environment. */
export const WARM_UP_ENV = 'BUN_JSC_useWarmUpMarkedBlocks'

/** Whether the executable's arguments (after its path) start the router: `serve`, flags, or none. */
export function startsRouter(args: readonly string[]): boolean {
  const first = args[0]
  if (first === undefined || first === 'serve') return true
  return first.startsWith('-') && !['--help', '-h', '--version'].includes(first)
}

/**
 * Runs this executable again with the tuned runtime, unless the environment already says how to
 * run it. Returns only when it does not (the setting given, not Linux, or execve refused).
 */
export function reexecTuned(): void {
  if (process.platform !== 'linux') return
  // The arguments and environment exactly as the process was given them, byte for byte (not
  // process.env, which also holds what Bun read from a .env file), plus the setting; the same
  // executable image (/proc/self/exe), whether Bun running the sources or the compiled tropa.
  let argv: Buffer[]
  let env: Buffer[]
  let libc: ReturnType<typeof openLibc>
  try {
    argv = cStrings(readFileSync('/proc/self/cmdline'))
    env = cStrings(readFileSync('/proc/self/environ'))
    // Given (a .env file's does not count: Bun reads those after its runtime's settings).
    if (env.some((kv) => kv.toString('latin1').startsWith(`${WARM_UP_ENV}=`))) return
    env.push(Buffer.from(`${WARM_UP_ENV}=0\0`))
    libc = openLibc()
  } catch {
    return // no /proc, or a libc by another name (musl): run as Bun sets it
  }
  const path = Buffer.from('/proc/self/exe\0')
  libc.symbols.execve(ptr(path), ptr(pointers(argv)), ptr(pointers(env)))
  // execve returned: it failed. This process carries on as it is.
  libc.close()
}

/** The NUL-terminated strings of a /proc file, each a Buffer of its own with its NUL. */
function cStrings(file: Buffer): Buffer[] {
  const out: Buffer[] = []
  let from = 0
  for (let i = file.indexOf(0); i !== -1; i = file.indexOf(0, from)) {
    if (i > from) out.push(Buffer.from(file.subarray(from, i + 1)))
    from = i + 1
  }
  return out
}

/** A NULL-terminated array of pointers to the strings (kept alive by the caller until execve). */
function pointers(strings: Buffer[]): BigUint64Array {
  const t = new BigUint64Array(strings.length + 1)
  strings.forEach((s, i) => {
    t[i] = BigInt(ptr(s))
  })
  return t
}

function openLibc() {
  return dlopen('libc.so.6', {
    execve: { args: [FFIType.ptr, FFIType.ptr, FFIType.ptr], returns: FFIType.i32 },
  })
}
