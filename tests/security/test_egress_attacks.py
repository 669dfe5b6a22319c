"""Egress attacks of a networked sandbox (issue 16) in the escape suite's report. The tests live
in tests/e2e/test_egress.py, marked @attack there, and run in its lab (netlab.py: sbxd in a
test namespace behind a stand-in internet; nothing leaves the machine); importing them here is
what collects them into this suite. Each fails if the sandbox got through."""

from test_egress import (lab, test_allow_list_reaches_exactly_its_rules,  # noqa: F401
                         test_domain_rules_narrow_open_and_admit_nothing_by_address,
                         test_open_reaches_the_internet_and_nothing_blocked,
                         test_spoofed_sources_are_dropped)

from secutil import lab_unaffected

unaffected = lab_unaffected("lab")
