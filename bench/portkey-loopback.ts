import http from 'node:http'

/**
 * Preloaded into Portkey's gateway (`bun --preload`): its start-server.js has no host flag and
 * listens on every interface; the benchmark keeps all traffic on 127.0.0.1, so a listen() without
 * a host gets 127.0.0.1.
 */
const listen = http.Server.prototype.listen
http.Server.prototype.listen = function (this: http.Server, ...args: unknown[]) {
  if (typeof args[0] === 'number' && (args[1] === undefined || typeof args[1] === 'function')) {
    if (args[1] === undefined) args[1] = '127.0.0.1'
    else args.splice(1, 0, '127.0.0.1')
  }
  return Reflect.apply(listen, this, args) as http.Server
} as typeof listen
