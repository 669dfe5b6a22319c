"""Attacks on the Host/SNI check of domain rules (issue 16) in the escape suite's report: the
tests of tests/e2e/test_egress_proxy.py marked @attack, in its lab (a TLS server answering
several names on one address). Each fails if the sandbox got through."""

from test_egress_proxy import (plab,  # noqa: F401
                               test_allowed_name_at_an_address_it_did_not_resolve_to_is_refused,
                               test_disallowed_sni_or_host_at_an_allowed_address_is_refused,
                               test_no_name_direct_ip_and_udp_are_refused)

from secutil import lab_unaffected

unaffected = lab_unaffected("plab")
