"""Many sandboxes at once."""

import time
from concurrent.futures import ThreadPoolExecutor


def test_twenty_sandboxes_at_once(api, metrics):
    n = 20

    def one(i):
        client = api.clone()
        try:
            t0 = time.monotonic()
            sb = client.create_sandbox({"labels": {"e2e": "concurrency", "index": str(i)}}, timeout=180)["sandbox"]
            created = time.monotonic() - t0
            result = client.run(sb["id"], ["sh", "-c", f"echo sandbox {i}; hostname >/dev/null"])
            assert result.exit["exit_code"] == 0, (i, result.exit, result.stderr)
            assert result.stdout == f"sandbox {i}\n".encode(), (i, result.stdout)
            op = client.delete_sandbox(sb["id"], timeout=180)
            assert op["state"] == "succeeded", (i, op)
            assert client.get_sandbox(sb["id"])["state"] == "deleted"
            return sb["id"], created
        finally:
            client.close()

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=n) as pool:
        futures = [pool.submit(one, i) for i in range(n)]
        results, failures = [], []
        for i, f in enumerate(futures):
            try:
                results.append(f.result(timeout=300))
            except Exception as e:  # noqa: BLE001 - report every failure, not just the first
                failures.append(f"sandbox {i}: {type(e).__name__}: {e}")
    total = time.monotonic() - t0
    assert not failures, f"{len(failures)}/{n} failed:\n" + "\n".join(failures)
    ids = [r[0] for r in results]
    assert len(set(ids)) == n, "sandbox ids must be unique"
    creates = sorted(r[1] for r in results)
    metrics.append(f"{n} concurrent sandboxes (create+run+delete): {total:.2f} s total; create to running "
                   f"median {creates[n // 2]:.2f} s, max {creates[-1]:.2f} s")
