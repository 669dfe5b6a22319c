"""How processes end: exit codes, signals, exec failures."""


def test_nonzero_exit(api, sandbox):
    result = api.run(sandbox["id"], ["sh", "-c", "echo bye; exit 3"])
    assert result.stdout == b"bye\n"
    assert result.exit == {"exit_code": 3, "signal": None, "timed_out": False, "oom_killed": False}, result.exit
    info = api.get_session(result.session["session_id"])
    assert info["state"] == "exited" and info["exit_code"] == 3 and info["signal"] is None, info


def test_killed_by_signal(api, sandbox):
    result = api.run(sandbox["id"], ["sh", "-c", "echo before; kill -9 $$; echo after"])
    assert result.stdout == b"before\n", result.stdout
    assert result.exit == {"exit_code": None, "signal": "SIGKILL", "timed_out": False, "oom_killed": False}, \
        result.exit
    info = api.get_session(result.session["session_id"])
    assert info["state"] == "exited" and info["exit_code"] is None and info["signal"] == "SIGKILL", info


def test_sigterm_reported_by_name(api, sandbox):
    result = api.run(sandbox["id"], ["sh", "-c", "kill -TERM $$"])
    assert result.exit["signal"] == "SIGTERM" and result.exit["exit_code"] is None, result.exit


def test_missing_binary(api, sandbox):
    result = api.run(sandbox["id"], ["/no/such/binary-e2e", "arg"])
    assert result.exit["exit_code"] == 127 and result.exit["signal"] is None, result.exit
    assert result.stdout == b""
    assert result.stderr.strip(), "a failed exec must explain itself on stderr"
    assert b"binary-e2e" in result.stderr, result.stderr


def test_missing_binary_via_path_lookup(api, sandbox):
    result = api.run(sandbox["id"], ["no-such-command-e2e"])
    assert result.exit["exit_code"] == 127, result.exit
    assert b"no-such-command-e2e" in result.stderr, result.stderr


def test_argv_is_not_a_shell_string(api, sandbox):
    result = api.run(sandbox["id"], ["echo", "$HOME; rm -rf /", "*"])
    assert result.stdout == b"$HOME; rm -rf / *\n", result.stdout


def test_env_and_cwd(api):
    sb = api.create_sandbox({"env": {"SBX_E2E_A": "from-sandbox", "SBX_E2E_B": "base"}})["sandbox"]
    result = api.run(sb["id"], ["sh", "-c", 'echo "$SBX_E2E_A $SBX_E2E_B"; pwd'],
                     env={"SBX_E2E_B": "from-session"}, cwd="/tmp")
    assert result.exit["exit_code"] == 0, (result.exit, result.stderr)
    assert result.stdout == b"from-sandbox from-session\n/tmp\n", result.stdout
