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
