"""One sbxd of its own with tenants made through its admin API, for the tenancy tests
(test_tenancy.py, test_tenant_templates.py): their tenants, rates and quotas must not leak into
the other suites. Closing it deletes the tenants (and so their sandboxes and templates) and
checks that nothing is left."""
from __future__ import annotations

import re

import cross_tenant
from conftest import Daemon, shutdown
from sbx_client import SbxClient

ALL_SCOPES = ["read", "sandboxes", "sessions", "files", "templates", "admin"]


class TenancyLab:
    def __init__(self, validator):
        self.validator = validator
        self.daemon = Daemon()
        self.daemon.start()
        self.admin = SbxClient(self.daemon.url, self.daemon.token, validator)
        self.clients: list[SbxClient] = []
        self.tenants: list[str] = []

    def tenant(self, name: str, **fields) -> str:
        t = self.admin.call("POST", "/v1/admin/tenants", json_body={"name": name, **fields},
                            expect=201).body["tenant"]
        assert t["state"] == "active" and t["id"].startswith("ten_"), t
        self.tenants.append(t["id"])
        return t["id"]

    def token(self, tenant: str, scopes=None, by: SbxClient | None = None, **fields) -> dict:
        body = {"name": "t", "scopes": scopes or ALL_SCOPES, **fields}
        tok = (by or self.admin).call("POST", f"/v1/admin/tenants/{tenant}/tokens", json_body=body,
                                      expect=201).body["token"]
        assert re.fullmatch(r"sbxm1_[a-z2-7]{20}_[A-Za-z0-9_-]{43}", tok["token"]), tok
        return tok

    def client(self, token: str) -> SbxClient:
        c = SbxClient(self.daemon.url, token, self.validator)
        self.clients.append(c)
        return c

    def close(self) -> list[str]:
        ids = [i for c in self.clients for i in c.created_sandboxes] + self.admin.created_sandboxes
        cross_tenant.delete_tenants(self.admin, self.tenants)
        problems = shutdown(self.daemon, self.validator, ids)
        for c in self.clients + [self.admin]:
            c.close()
        return problems
