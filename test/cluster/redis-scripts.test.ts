import { expect, test } from 'bun:test'
import { RedisScripts } from '../../src/cluster/redis-scripts.ts'

// Scripts run in the order they are called, a script's first use included: the shared meter
// sends one turn's settlements before its reservations and relies on Redis taking them so.
test('a script used for the first time is not overtaken by a later call of a script already used', async () => {
  const url = process.env.TROPA_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379'
  const tag = `${process.pid}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`
  const key = `tropa-test-scripts:${tag}`
  // The tag in the text: Redis has never seen these scripts, so the first use must carry the text.
  const scripts = new RedisScripts(url, {
    SET: `-- ${tag}\nredis.call('SET', KEYS[1], ARGV[1]) return 'OK'`,
    GET: `-- ${tag}\nreturn redis.call('GET', KEYS[1]) or ''`,
  })
  try {
    expect(await scripts.run('GET', [key], [])).toBe('')
    // SET is new, GET is known: GET, called after SET, must see SET's value.
    const [set, get] = await Promise.all([
      scripts.run('SET', [key], ['written']),
      scripts.run('GET', [key], []),
    ])
    expect(set).toBe('OK')
    expect(get).toBe('written')
    // And once Redis forgot them (a restart), the text is sent again.
    await scripts.redis.send('SCRIPT', ['FLUSH'])
    expect(await scripts.run('GET', [key], [])).toBe('written')
  } finally {
    await scripts.redis.send('DEL', [key])
    scripts.redis.close()
  }
})

test("one turn's calls go in one script call, each as alone, in the order called", async () => {
  const url = process.env.TROPA_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379'
  const tag = `${process.pid}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2)}`
  const key = `tropa-test-turn:${tag}`
  const scripts = new RedisScripts(url, {
    // Appends ARGV[1] to the list and returns its length.
    PUSH: `-- ${tag}\nreturn redis.call('RPUSH', KEYS[1], ARGV[1])`,
    // Raises an error after writing: the other calls of the turn still run.
    FAIL: `-- ${tag}\nredis.call('RPUSH', KEYS[1], 'before-failure')\nreturn redis.call('INCR', KEYS[2])`,
    NOTHING: `-- ${tag}\nreturn nil`,
    LIST: `-- ${tag}\nreturn redis.call('LRANGE', KEYS[1], 0, -1)`,
  })
  try {
    await scripts.redis.connect()
    await scripts.redis.send('SET', [`${key}:text`, 'not a number'])
    const sent: string[] = []
    const send = scripts.redis.send.bind(scripts.redis)
    scripts.redis.send = (cmd: string, args: string[]) => {
      sent.push(cmd)
      return send(cmd, args)
    }
    const calls = [
      scripts.inTurn('PUSH', [key], ['a']),
      scripts.inTurn('FAIL', [key, `${key}:text`], []).then(
        () => 'resolved',
        (err: Error) => err.message,
      ),
      scripts.inTurn('NOTHING', [], []),
      scripts.inTurn('PUSH', [key], ['b']),
      scripts.inTurn('LIST', [key], []),
    ]
    const [a, failed, nothing, b, list] = await Promise.all(calls)
    expect(sent).toEqual(['EVAL']) // one call, the turn's script sent by its text the first time
    expect(a).toBe(1)
    expect(failed).toContain('not an integer')
    expect(nothing).toBeNull()
    expect(b).toBe(3)
    expect(list).toEqual(['a', 'before-failure', 'b'])
    // 300 calls in one turn: three calls of at most 128, in order; then the text is known.
    sent.length = 0
    const many = await Promise.all(
      Array.from({ length: 300 }, (_, i) => scripts.inTurn('PUSH', [key], [String(i)])),
    )
    expect(many).toEqual(Array.from({ length: 300 }, (_, i) => 4 + i))
    expect(sent).toEqual(['EVALSHA', 'EVALSHA', 'EVALSHA'])
    scripts.redis.send = send
  } finally {
    await scripts.redis.send('DEL', [key, `${key}:text`])
    scripts.redis.close()
  }
})
