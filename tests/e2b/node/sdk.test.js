// The JavaScript SDK (npm `e2b`, `@e2b/code-interpreter`) against sbxd, through its documented
// public calls only, with nothing but E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY pointing it at
// sbx. Run one test at a time by tests/e2b/test_node_sdk.py (node --test --test-name-pattern),
// which sets those and NODE_PATH (the node_modules tools/e2b/sdk-env.sh installed). Every test
// name is a plain string literal: the wrapper reads them from this file to make one pytest test
// each. Each sandbox is killed in a finally; the wrapper checks that none is left.
'use strict'

const { test } = require('node:test')
const assert = require('node:assert/strict')
const { randomUUID } = require('node:crypto')
const {
  Sandbox, CommandExitError, NotFoundError, FileNotFoundError, AuthenticationError, SandboxError,
  FilesystemEventType, FileType,
} = require('e2b')

const TIMEOUT_MS = 120_000

async function withSandbox(opts, fn) {
  const sbx = await Sandbox.create({ timeoutMs: TIMEOUT_MS, ...opts })
  try {
    return await fn(sbx)
  } finally {
    await sbx.kill().catch(() => {})
  }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

async function until(what, check, timeoutMs = 20_000, intervalMs = 100) {
  const deadline = Date.now() + timeoutMs
  let last
  while (Date.now() < deadline) {
    last = await check()
    if (last) return last
    await sleep(intervalMs)
  }
  assert.fail(`${what}: not within ${timeoutMs} ms (last: ${JSON.stringify(last)})`)
}

async function pids(sbx) {
  return (await sbx.commands.list()).map((p) => p.pid)
}

// ---- lifecycle ---------------------------------------------------------------------------------

test('create with metadata and envs', async () => {
  const metadata = { suite: 'e2b-node', case: 'create', note: 'a b&c=d' }
  await withSandbox({ metadata, envs: { GREETING: 'hello from envs', N: '7' } }, async (sbx) => {
    assert.ok(sbx.sandboxId)
    assert.equal(await sbx.isRunning(), true)
    const r = await sbx.commands.run('echo "$GREETING/$N"')
    assert.deepEqual([r.exitCode, r.stdout, r.stderr], [0, 'hello from envs/7\n', ''])
    const info = await sbx.getInfo()
    assert.equal(info.sandboxId, sbx.sandboxId)
    assert.ok(info.templateId)
    assert.deepEqual(info.metadata, metadata)
    assert.equal(info.state, 'running')
    assert.ok(info.startedAt <= new Date() && new Date() < info.endAt)
  })
})

test('run with stdout and stderr callbacks', async () => {
  const out = []
  const err = []
  await withSandbox({}, async (sbx) => {
    const r = await sbx.commands.run('echo one; echo two >&2; echo three', {
      onStdout: (d) => out.push(d), onStderr: (d) => err.push(d),
    })
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'one\nthree\n')
    assert.equal(out.join(''), r.stdout)
    assert.equal(r.stderr, 'two\n')
    assert.equal(err.join(''), r.stderr)
  })
})

test('non-zero exit throws CommandExitError', async () => {
  await withSandbox({}, async (sbx) => {
    await assert.rejects(sbx.commands.run('echo partial; echo why >&2; exit 3'), (e) => {
      assert.ok(e instanceof CommandExitError, `${e?.constructor?.name}: ${e}`)
      assert.equal(e.exitCode, 3)
      assert.equal(e.stdout, 'partial\n')
      assert.equal(e.stderr, 'why\n')
      return true
    })
  })
})

test('env and cwd per command', async () => {
  await withSandbox({ envs: { A: 'sandbox', B: 'sandbox' } }, async (sbx) => {
    await sbx.files.makeDir('/tmp/work dir')
    const r = await sbx.commands.run('echo "$A $B"; pwd', { envs: { A: 'command' }, cwd: '/tmp/work dir' })
    assert.equal(r.stdout, 'command sandbox\n/tmp/work dir\n')
    const r2 = await sbx.commands.run('echo "$A"; pwd', { cwd: '/tmp' })
    assert.equal(r2.stdout, 'sandbox\n/tmp\n')
  })
})

test('background command and reconnect', async () => {
  await withSandbox({}, async (sbx) => {
    const h = await sbx.commands.run('for i in $(seq 1 15); do echo tick $i; sleep 0.2; done; echo done', {
      background: true,
    })
    assert.ok(h.pid > 0)
    assert.ok((await pids(sbx)).includes(h.pid))
    await h.disconnect()
    const seen = []
    const h2 = await sbx.commands.connect(h.pid, { onStdout: (d) => seen.push(d) })
    assert.equal(h2.pid, h.pid)
    const r = await h2.wait()
    assert.equal(r.exitCode, 0)
    assert.ok(r.stdout.endsWith('tick 15\ndone\n'), r.stdout)
    assert.equal(seen.join(''), r.stdout)
    await until('the finished process leaves commands.list()', async () => !(await pids(sbx)).includes(h.pid))
  })
})

test('kill a process', async () => {
  await withSandbox({}, async (sbx) => {
    const h = await sbx.commands.run('sleep 600', { background: true })
    assert.ok((await pids(sbx)).includes(h.pid))
    assert.equal(await sbx.commands.kill(h.pid), true)
    await assert.rejects(h.wait(), CommandExitError)
    await until('the killed process leaves commands.list()', async () => !(await pids(sbx)).includes(h.pid))
    assert.equal(await sbx.commands.kill(h.pid), false)
    const h2 = await sbx.commands.run('sleep 600', { background: true })
    assert.equal(await h2.kill(), true)
    await assert.rejects(h2.wait(), CommandExitError)
  })
})

test('stdin with sendStdin and closeStdin', async () => {
  await withSandbox({}, async (sbx) => {
    const h = await sbx.commands.run('cat; echo EOF', { background: true, stdin: true })
    await sbx.commands.sendStdin(h.pid, 'line one\n')
    await h.sendStdin('line two\n')
    await sbx.commands.closeStdin(h.pid)
    const r = await h.wait()
    assert.equal(r.stdout, 'line one\nline two\nEOF\n')
  })
})

test('pty create, input, resize, output, kill', async () => {
  await withSandbox({}, async (sbx) => {
    const chunks = []
    const dec = new TextDecoder()
    const h = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => chunks.push(dec.decode(d, { stream: true })), timeoutMs: 60_000 })
    assert.ok((await pids(sbx)).includes(h.pid))
    const enc = new TextEncoder()
    await sbx.pty.sendInput(h.pid, enc.encode('stty size; echo marker-$((6*7))\n'))
    await until('the pty echoes marker-42', () => chunks.join('').includes('marker-42'))
    await sbx.pty.resize(h.pid, { cols: 100, rows: 30 })
    await sbx.pty.sendInput(h.pid, enc.encode('stty size; exit 0\n'))
    const r = await h.wait()
    const out = chunks.join('')
    assert.equal(r.exitCode, 0)
    assert.ok(out.includes('24 80') && out.includes('30 100'), out)
    const h2 = await sbx.pty.create({ cols: 40, rows: 10, onData: () => {}, timeoutMs: 60_000 })
    assert.equal(await sbx.pty.kill(h2.pid), true)
    await assert.rejects(h2.wait(), CommandExitError)
  })
})

// ---- files -------------------------------------------------------------------------------------

test('files write and read text and binary', async () => {
  await withSandbox({}, async (sbx) => {
    const info = await sbx.files.write('/tmp/acc/hello.txt', 'hello world\nsecond line\n')
    assert.equal(info.path, '/tmp/acc/hello.txt')
    assert.equal(info.name, 'hello.txt')
    assert.equal(await sbx.files.read('/tmp/acc/hello.txt'), 'hello world\nsecond line\n')
    const blob = new Uint8Array([0x00, 0x01, 0x02, 0xfa, 0xff, 0x0a])
    await sbx.files.write('/tmp/acc/blob.bin', blob.buffer)
    assert.deepEqual(Array.from(await sbx.files.read('/tmp/acc/blob.bin', { format: 'bytes' })), Array.from(blob))
    const od = await sbx.commands.run('od -An -tx1 /tmp/acc/blob.bin')
    assert.deepEqual(od.stdout.trim().split(/\s+/), ['00', '01', '02', 'fa', 'ff', '0a'])
    await sbx.files.write('/tmp/acc/empty', '')
    assert.equal(await sbx.files.read('/tmp/acc/empty'), '')
    await assert.rejects(sbx.files.read('/tmp/acc/missing.txt'), FileNotFoundError)
  })
})

test('files several in one write', async () => {
  await withSandbox({}, async (sbx) => {
    const entries = [
      { path: '/tmp/multi/a.txt', data: 'alpha' },
      { path: '/tmp/multi/sub/b.txt', data: 'beta' },
      { path: '/tmp/multi/c.bin', data: new Uint8Array([0x00, 0xff]).buffer },
    ]
    const infos = await sbx.files.write(entries)
    assert.deepEqual(infos.map((i) => i.path).sort(), entries.map((e) => e.path).sort())
    assert.equal(await sbx.files.read('/tmp/multi/a.txt'), 'alpha')
    assert.equal(await sbx.files.read('/tmp/multi/sub/b.txt'), 'beta')
    assert.deepEqual(Array.from(await sbx.files.read('/tmp/multi/c.bin', { format: 'bytes' })), [0x00, 0xff])
  })
})

test('files exists, makeDir, list, rename, remove', async () => {
  await withSandbox({}, async (sbx) => {
    const d = '/tmp/tree'
    assert.equal(await sbx.files.exists(d), false)
    assert.equal(await sbx.files.makeDir(d), true)
    assert.equal(await sbx.files.makeDir(d), false)
    assert.equal(await sbx.files.exists(d), true)
    await sbx.files.makeDir(`${d}/inner`)
    await sbx.files.write(`${d}/f.txt`, '12345')
    const entries = Object.fromEntries((await sbx.files.list(d)).map((e) => [e.name, e]))
    assert.deepEqual(Object.keys(entries).sort(), ['f.txt', 'inner'])
    assert.equal(entries.inner.type, FileType.DIR)
    assert.equal(entries['f.txt'].type, FileType.FILE)
    assert.equal(entries['f.txt'].size, 5)
    assert.equal(entries['f.txt'].path, `${d}/f.txt`)
    const moved = await sbx.files.rename(`${d}/f.txt`, `${d}/g.txt`)
    assert.equal(moved.path, `${d}/g.txt`)
    assert.equal(await sbx.files.exists(`${d}/f.txt`), false)
    assert.equal(await sbx.files.read(`${d}/g.txt`), '12345')
    await sbx.files.remove(d)
    assert.equal(await sbx.files.exists(d), false)
    await assert.rejects(sbx.files.list(d), NotFoundError)
  })
})

test('files watchDir stream', async () => {
  await withSandbox({}, async (sbx) => {
    const d = '/tmp/watched'
    await sbx.files.makeDir(d)
    const events = []
    const w = await sbx.files.watchDir(d, (e) => events.push(e), { timeoutMs: 60_000 })
    try {
      await sbx.files.write(`${d}/new.txt`, 'x')
      await sbx.commands.run(`rm ${d}/new.txt`)
      await until('watchDir events for new.txt (create/write, then remove)', () => {
        const kinds = new Set(events.filter((e) => e.name === 'new.txt').map((e) => e.type))
        return kinds.has(FilesystemEventType.REMOVE) &&
          (kinds.has(FilesystemEventType.CREATE) || kinds.has(FilesystemEventType.WRITE))
      }, 15_000)
    } finally {
      await w.stop()
    }
  })
})

// ---- listing, timeouts, pause ------------------------------------------------------------------

async function listIds(query) {
  const p = Sandbox.list({ query })
  const out = []
  while (p.hasNext) out.push(...(await p.nextItems()).map((s) => s.sandboxId))
  return out
}

test('Sandbox.list with metadata filters', async () => {
  const run = randomUUID().slice(0, 12)
  await withSandbox({ metadata: { run, n: '1', owner: 'a b&c' } }, async (one) => {
    await withSandbox({ metadata: { run, n: '2' } }, async (two) => {
      assert.deepEqual((await listIds({ metadata: { run } })).sort(), [one.sandboxId, two.sandboxId].sort())
      assert.deepEqual(await listIds({ metadata: { run, n: '2' } }), [two.sandboxId])
      assert.deepEqual(await listIds({ metadata: { owner: 'a b&c' } }), [one.sandboxId])
      assert.deepEqual(await listIds({ metadata: { run: 'no-such-run' } }), [])
      const [listed] = await Sandbox.list({ query: { metadata: { run, n: '1' } } }).nextItems()
      assert.deepEqual(listed.metadata, { run, n: '1', owner: 'a b&c' })
      assert.equal(listed.state, 'running')
    })
  })
})

test('setTimeout and expiry', async () => {
  await withSandbox({ timeoutMs: 60_000 }, async (sbx) => {
    await sbx.setTimeout(600_000)
    const left = ((await sbx.getInfo()).endAt - new Date()) / 1000
    assert.ok(left > 540 && left <= 600, `${left}`)
    await sbx.setTimeout(3_000)
    await until('the sandbox expires 3 s after setTimeout(3000)', async () => !(await sbx.isRunning()), 40_000, 500)
    await assert.rejects(Sandbox.getInfo(sbx.sandboxId), NotFoundError)
    assert.equal(await Sandbox.kill(sbx.sandboxId), false)
  })
})

test('pause and connect keep files and processes', async () => {
  await withSandbox({}, async (sbx) => {
    await sbx.files.write('/tmp/state.txt', 'kept across pause')
    const h = await sbx.commands.run('while true; do echo tick; date +%s%N >> /tmp/ticks; sleep 0.2; done', { background: true })
    const ticks = async () => parseInt((await sbx.commands.run('wc -l < /tmp/ticks 2>/dev/null || echo 0')).stdout, 10)
    await until('the background process writes', async () => (await ticks()) > 0)
    await h.disconnect()
    assert.equal(await sbx.pause(), true)
    assert.equal((await sbx.getInfo()).state, 'paused')
    const paused = await Sandbox.list({ query: { state: ['paused'] } }).nextItems()
    assert.ok(paused.map((s) => s.sandboxId).includes(sbx.sandboxId))
    const again = await Sandbox.connect(sbx.sandboxId)
    assert.equal((await again.getInfo()).state, 'running')
    assert.equal(await again.files.read('/tmp/state.txt'), 'kept across pause')
    assert.ok((await pids(again)).includes(h.pid))
    const before = await ticks()
    await until('the process goes on writing after connect', async () => (await ticks()) > before)
    // Its output goes on too: a new handle reads a new line.
    let got = ''
    const h2 = await again.commands.connect(h.pid, { onStdout: (d) => { got += d } })
    await until('output of the resumed process', () => got.includes('tick'))
    await h2.disconnect()
    assert.equal(await again.commands.kill(h.pid), true)
  })
})

test('connect by id from another client', async () => {
  await withSandbox({ metadata: { case: 'connect-by-id' } }, async (sbx) => {
    await sbx.files.write('/tmp/from-first.txt', 'first')
    const other = await Sandbox.connect(sbx.sandboxId)
    assert.equal(other.sandboxId, sbx.sandboxId)
    assert.equal(await other.files.read('/tmp/from-first.txt'), 'first')
    assert.equal((await other.commands.run('echo second')).stdout, 'second\n')
  })
})

test('kill then not found', async () => {
  const sbx = await Sandbox.create({ timeoutMs: TIMEOUT_MS })
  const id = sbx.sandboxId
  try {
    assert.equal(await sbx.kill(), true)
  } finally {
    await Sandbox.kill(id).catch(() => {})
  }
  assert.equal(await sbx.isRunning(), false)
  await assert.rejects(Sandbox.connect(id), NotFoundError)
  await assert.rejects(Sandbox.getInfo(id), NotFoundError)
  assert.equal(await Sandbox.kill(id), false)
  assert.equal(await sbx.kill(), false)
})

// ---- errors ------------------------------------------------------------------------------------

test('bad API key', async () => {
  for (const apiKey of ['sbxm1_aaaaaaaaaaaaaaaaaaaa_' + 'A'.repeat(43), 'not-a-key']) {
    await assert.rejects(Sandbox.create({ apiKey, timeoutMs: 30_000 }), AuthenticationError)
    await assert.rejects(Sandbox.list({ apiKey }).nextItems(), AuthenticationError)
  }
})

test('unknown template', async () => {
  const name = `no-such-template-${randomUUID().slice(0, 8)}`
  await assert.rejects(Sandbox.create(name, { timeoutMs: 30_000 }), (e) => {
    assert.ok(e instanceof SandboxError, `${e?.constructor?.name}: ${e}`)
    assert.ok(String(e.message).includes(name), e.message)
    return true
  })
})

// ---- the code interpreter ----------------------------------------------------------------------

// The wrapper runs this one only once the template code-interpreter-v1 is in sbxd.
test('runCode with a plot', async () => {
  const { Sandbox: CodeSandbox } = require('@e2b/code-interpreter')
  const sbx = await CodeSandbox.create({ timeoutMs: TIMEOUT_MS }) // the SDK's default template
  try {
    let ex = await sbx.runCode("x = 6 * 7\nprint('out', x)\nx")
    assert.equal(ex.error, undefined)
    assert.deepEqual(ex.logs.stdout, ['out 42\n'])
    assert.equal(ex.text, '42')
    ex = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()')
    assert.equal(ex.error, undefined)
    const png = ex.results.find((r) => r.png)?.png
    assert.ok(png, JSON.stringify(ex.results))
    assert.deepEqual([...Buffer.from(png, 'base64').subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])
    ex = await sbx.runCode('1 / 0')
    assert.equal(ex.error?.name, 'ZeroDivisionError')
    const ctx = await sbx.createCodeContext()
    await sbx.runCode('y = 5', { context: ctx })
    assert.equal((await sbx.runCode('y * 2', { context: ctx })).text, '10')
  } finally {
    await sbx.kill().catch(() => {})
  }
})
