"""DNS attacks of a sandbox with domain rules (issue 16) in the escape suite's report: the tests
of tests/e2e/test_egress_dns.py marked @attack, in its lab (a DNS server the test controls,
which forges answers on demand). Each fails if the sandbox got through."""

from test_egress_dns import (lab, test_allow_list_resolves_exactly_its_names,  # noqa: F401
                             test_dns_to_another_resolver_is_refused_under_domain_rules,
                             test_forged_answer_to_private_addresses_is_stripped,
                             test_resolver_port_is_not_reachable_directly,
                             test_unresolved_address_is_dropped_and_counted)

from secutil import lab_unaffected

unaffected = lab_unaffected("lab")
