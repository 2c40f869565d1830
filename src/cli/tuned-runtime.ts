import { dlopen, FFIType, ptr } from 'bun:ffi'
import { readFileSync, readlinkSync } from 'node:fs'

// JavaScriptCore's settings are read from the environment once, when the process starts, and
// cannot be changed from JavaScript after. The one Tropa changes:
//
// `useWarmUpMarkedBlocks` (on by default in Bun 1.4.5) keeps a helper thread, "JSCWarmUp", that
// pre-faults the heap's 16 KB blocks so the main thread need not. Under a router's steady load
// the blocks freed by each young collection go back to the allocator, whose scavenger returns
// their pages to the kernel (madvise), and the helper faults fresh ones in again: on 2 cores the
// two took 20-25 us of CPU per request beside the main thread's 80-90, and with the helper off a
// router served a third more short requests a second on a third less CPU per request, paired
// (bench/results/2026-11-28j-jsc-warm-up-thread.md; long prompts and streams not resolved). A bare proxy allocates too little to notice.
//
// So the router, when started without the setting, runs itself again in place (execve of the
// same file: the same process id and name, arguments, standard streams and environment, plus the
// setting) before its other modules are evaluated (cli/tuned-start.ts, main.ts's first import).
// Setting the variable yourself (to 0 or 1) is taken as it is, with no second start; the other
// subcommands never start twice (docs/config.md, "The runtime's own setting").

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
 * run it. Returns only when it does not: the setting given, not Linux, a debugger or profiler
 * asked for (`--inspect*`: it would attach to the process about to be replaced; `--cpu-prof*`: a
 * pending sampling signal, SIGPWR, survives the exec and kills the new image), descriptors
 * passed by systemd (`LISTEN_FDS`: Bun closes inherited descriptors past 3 on an exec), or the
 * exec refused (then with one line on stderr).
 */
export function reexecTuned(): void {
  if (process.platform !== 'linux') return
  if (process.env.LISTEN_FDS !== undefined || process.execArgv.some((a) => /^--(inspect|cpu-prof)/.test(a)))
    return
  // The arguments and environment exactly as the process was given them, byte for byte (empty
  // ones too; not process.env, which also holds what Bun read from a .env file), plus the
  // setting; the same executable file, by its own name (the process's name in ps, top and pkill
  // comes from it), whether Bun running the sources or the compiled tropa.
  let argv: Buffer[]
  let env: Buffer[]
  let path: Buffer
  let libc: ReturnType<typeof openLibc>
  try {
    argv = cStrings(readFileSync('/proc/self/cmdline'))
    env = cStrings(readFileSync('/proc/self/environ'))
    // Given (a .env file's does not count: Bun reads those after its runtime's settings).
    if (env.some((kv) => kv.toString('latin1').startsWith(`${WARM_UP_ENV}=`))) return
    env.push(Buffer.from(`${WARM_UP_ENV}=0\0`))
    path = Buffer.from(`${executable()}\0`)
    libc = openLibc()
  } catch (err) {
    notApplied((err as Error).message) // no /proc, or no libc.so.6 (musl)
    return
  }
  // The tables hold the strings' addresses only: every Buffer and both tables are held by the
  // module until execve has copied them (no collection may free one in between).
  const argvTable = pointers(argv)
  const envTable = pointers(env)
  heldForExec.push(path, ...argv, ...env, argvTable, envTable)
  libc.symbols.execve(ptr(path), ptr(argvTable), ptr(envTable))
  // execve returned: it failed. This process carries on as it is.
  heldForExec.length = 0
  libc.close()
  notApplied('execve failed')
}

const heldForExec: ArrayBufferView[] = []

/** The executable's path: /proc/self/exe resolved (so the process keeps its name), or itself. */
function executable(): string {
  try {
    return readlinkSync('/proc/self/exe')
  } catch {
    return '/proc/self/exe'
  }
}

function notApplied(why: string): void {
  console.error(`tropa: runtime setting ${WARM_UP_ENV}=0 not applied (${why}); running as Bun sets it`)
}

/** The NUL-terminated strings of a /proc file, each a Buffer of its own with its NUL (empty ones too). */
function cStrings(file: Buffer): Buffer[] {
  const out: Buffer[] = []
  let from = 0
  for (let i = file.indexOf(0); i !== -1; i = file.indexOf(0, from)) {
    out.push(Buffer.from(file.subarray(from, i + 1)))
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
