import { readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'

/**
 * A throwaway CA in `dir` and a server certificate it signed for 127.0.0.1 (openssl): for tests
 * of trusting a route's own CA. Returns the CA's PEM file and the server's certificate and key.
 */
export function testCa(dir: string) {
  const run = (...args: string[]) => {
    const r = Bun.spawnSync(['openssl', ...args], { cwd: dir, stderr: 'pipe' })
    if (r.exitCode !== 0) throw new Error(`openssl ${args[0]}: ${r.stderr.toString()}`)
  }
  run(
    'req',
    '-x509',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-keyout',
    'ca.key',
    '-out',
    'ca.pem',
    '-days',
    '1',
    '-subj',
    '/CN=Tropa Test Root CA',
  )
  run(
    'req',
    '-newkey',
    'rsa:2048',
    '-nodes',
    '-keyout',
    'srv.key',
    '-out',
    'srv.csr',
    '-subj',
    '/CN=127.0.0.1',
  )
  writeFileSync(join(dir, 'ext'), 'subjectAltName=IP:127.0.0.1\n')
  run(
    'x509',
    '-req',
    '-in',
    'srv.csr',
    '-CA',
    'ca.pem',
    '-CAkey',
    'ca.key',
    '-CAcreateserial',
    '-out',
    'srv.pem',
    '-days',
    '1',
    '-extfile',
    'ext',
  )
  return {
    caFile: join(dir, 'ca.pem'),
    cert: readFileSync(join(dir, 'srv.pem'), 'utf8'),
    key: readFileSync(join(dir, 'srv.key'), 'utf8'),
  }
}
