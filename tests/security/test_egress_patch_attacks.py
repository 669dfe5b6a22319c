"""Attacks on live egress changes and limits (issue 16) in the escape suite's report: the tests
of tests/e2e/test_egress_patch.py marked @attack, in its lab. Each fails if the sandbox got
through."""

from test_egress_patch import (plab, test_connection_limit_refuses_the_next_one,  # noqa: F401
                               test_patch_cuts_the_connection_it_forbids_and_keeps_the_others)

from secutil import lab_unaffected

unaffected = lab_unaffected("plab")
