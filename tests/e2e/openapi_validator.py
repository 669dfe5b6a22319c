"""Checks live HTTP responses against docs/api/openapi.yaml.

For a (method, concrete path, status) it finds the documented operation and response, then
validates the JSON body against that response's schema with jsonschema. Anything not
documented (path, method, status, content type) is a failure: the contract must describe what
the server really sends. A missing or unreadable spec fails every validation, never passes.

OpenAPI 3.0 schemas are validated as JSON Schema draft 4 after turning `nullable: true` into
a null-accepting type; 3.1 schemas are validated as draft 2020-12.
"""

from __future__ import annotations

import copy
import re
import threading
from pathlib import Path
from typing import Any

import jsonschema
import yaml

HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")

# RFC 3339 date-time (the `date-time` format); jsonschema only checks it when optional
# packages are installed, so the check is registered here explicitly.
_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


class SpecError(AssertionError):
    """The spec is missing, unreadable, or does not document what the server did."""


class ResponseInvalid(AssertionError):
    """The response body does not match its documented schema."""


def _convert_nullable(node: Any) -> Any:
    """OpenAPI 3.0 `nullable: true` -> JSON Schema null-accepting equivalent."""
    if isinstance(node, list):
        return [_convert_nullable(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _convert_nullable(v) for k, v in node.items()}
    if out.pop("nullable", False) is True:
        if "enum" in out and None not in out["enum"]:
            out["enum"] = list(out["enum"]) + [None]
        t = out.get("type")
        if isinstance(t, str):
            out["type"] = [t, "null"]
        elif isinstance(t, list):
            if "null" not in t:
                out["type"] = t + ["null"]
        else:
            # $ref / allOf / oneOf without a type: accept null beside the original schema.
            return {"anyOf": [out, {"type": "null"}]}
    return out


def _format_checker() -> jsonschema.FormatChecker:
    checker = jsonschema.FormatChecker(formats=())

    @checker.checks("date-time")
    def _date_time(value: Any) -> bool:  # noqa: ANN401
        return not isinstance(value, str) or bool(_RFC3339.match(value))

    return checker


class OpenApiValidator:
    def __init__(self, spec_path: Path):
        self.spec_path = Path(spec_path)
        self._lock = threading.Lock()
        self._loaded = False
        self._spec: dict | None = None
        self._routes: list[tuple[re.Pattern, str, dict]] = []
        self._validator_cls = None
        self._format_checker = _format_checker()

    # ---- loading -------------------------------------------------------------------------
    def _load(self) -> None:
        with self._lock:
            if self._loaded:
                return
            if not self.spec_path.is_file():
                raise SpecError(f"OpenAPI spec not found: {self.spec_path} (responses cannot be "
                                "validated; the contract file must exist)")
            try:
                spec = yaml.safe_load(self.spec_path.read_text())
            except (OSError, yaml.YAMLError) as e:
                raise SpecError(f"cannot read OpenAPI spec {self.spec_path}: {e}") from e
            if not isinstance(spec, dict) or not isinstance(spec.get("paths"), dict):
                raise SpecError(f"{self.spec_path}: not an OpenAPI document (no `paths`)")
            version = str(spec.get("openapi", ""))
            if version.startswith("3.0"):
                spec = _convert_nullable(spec)
                self._validator_cls = jsonschema.Draft4Validator
            elif version.startswith("3.1"):
                self._validator_cls = jsonschema.Draft202012Validator
            else:
                raise SpecError(f"{self.spec_path}: unsupported `openapi: {version}` (need 3.0/3.1)")
            # Server URL path prefix (e.g. servers: [{url: /v1}] with paths like /sandboxes).
            prefixes = {""}
            for server in spec.get("servers") or []:
                url = str(server.get("url", ""))
                m = re.match(r"^(?:[a-z]+://[^/]+)?(/.*)?$", url)
                if m and m.group(1):
                    prefixes.add(m.group(1).rstrip("/"))
            routes = []
            for template, item in spec["paths"].items():
                if not isinstance(item, dict):
                    continue
                for prefix in prefixes:
                    full = prefix + template
                    # Literal segments are escaped; {param} matches one segment. Templates
                    # with ':' verbs (files:list) stay literal.
                    parts = re.split(r"(\{[^}/]+\})", full)
                    rx = "".join("[^/]+" if p.startswith("{") and p.endswith("}") else re.escape(p)
                                 for p in parts if p)
                    routes.append((re.compile("^" + rx + "$"), template, item))
            # Literal matches beat parameter matches: sort by number of params, then length.
            routes.sort(key=lambda r: (r[1].count("{"), -len(r[1])))
            self._spec = spec
            self._routes = routes
            self._loaded = True

    @property
    def spec(self) -> dict:
        self._load()
        assert self._spec is not None
        return self._spec

    # ---- lookup --------------------------------------------------------------------------
    def find_operation(self, method: str, path: str) -> tuple[str, dict]:
        self._load()
        path = path.split("?", 1)[0]
        method = method.lower()
        matched_paths = []
        for rx, template, item in self._routes:
            if rx.match(path):
                matched_paths.append(template)
                op = item.get(method)
                if isinstance(op, dict):
                    return template, op
        if matched_paths:
            raise SpecError(f"{method.upper()} {path}: path {matched_paths[0]} is documented "
                            f"but method {method.upper()} is not")
        raise SpecError(f"{method.upper()} {path}: no documented path matches")

    def _deref(self, node: Any, depth: int = 0) -> Any:
        """Follows a local $ref (response objects and schemas)."""
        while isinstance(node, dict) and "$ref" in node and depth < 32:
            ref = node["$ref"]
            if not ref.startswith("#/"):
                raise SpecError(f"unsupported non-local $ref {ref!r}")
            target: Any = self._spec
            for part in ref[2:].split("/"):
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(target, dict) or part not in target:
                    raise SpecError(f"dangling $ref {ref!r}")
                target = target[part]
            node = target
            depth += 1
        return node

    def find_response(self, method: str, path: str, status: int) -> tuple[str, dict]:
        template, op = self.find_operation(method, path)
        responses = op.get("responses") or {}
        for key in (str(status), f"{str(status)[0]}XX", f"{str(status)[0]}xx", "default"):
            if key in responses:
                return template, self._deref(responses[key])
        raise SpecError(f"{method.upper()} {template}: status {status} is not documented "
                        f"(documented: {sorted(responses)})")

    # ---- validation ----------------------------------------------------------------------
    def validate(self, method: str, path: str, status: int, content_type: str | None,
                 body: Any = None, has_body: bool = True) -> None:
        """Validates one response. `body` is the parsed JSON (when the content type is JSON)."""
        template, response = self.find_response(method, path, status)
        content = response.get("content") or {}
        where = f"{method.upper()} {template} -> {status}"
        media = (content_type or "").split(";", 1)[0].strip().lower()
        if not has_body or not media:
            if content and has_body:
                raise SpecError(f"{where}: response has no Content-Type, documented: {sorted(content)}")
            return
        if not content:
            raise SpecError(f"{where}: a {media} body was sent but the spec documents no content")
        media_obj = content.get(media)
        if media_obj is None:
            # Wildcards such as application/* or */*.
            for key, val in content.items():
                if key == "*/*" or (key.endswith("/*") and media.startswith(key[:-1])):
                    media_obj = val
                    break
        if media_obj is None:
            raise SpecError(f"{where}: content type {media!r} not documented ({sorted(content)})")
        schema = (media_obj or {}).get("schema")
        if schema is None or not (media == "application/json" or media.endswith("+json")):
            return
        self.validate_schema(schema, body, where)

    def validate_schema(self, schema: Any, instance: Any, where: str = "") -> None:
        self._load()
        root = {"allOf": [copy.deepcopy(schema)], "components": self._spec.get("components", {})}
        if self._validator_cls is jsonschema.Draft202012Validator:
            root["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        validator = self._validator_cls(root, format_checker=self._format_checker)
        errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
        if errors:
            lines = []
            for e in errors[:10]:
                at = "/".join(str(p) for p in e.absolute_path) or "(root)"
                lines.append(f"  at {at}: {e.message[:300]}")
            raise ResponseInvalid(f"{where}: body does not match the OpenAPI schema:\n"
                                  + "\n".join(lines) + f"\nbody: {str(instance)[:1500]}")

    def validate_sse_event(self, path: str, event: str, data: Any, method: str = "GET") -> None:
        """Checks one SSE event against the `x-sse-events` map of the route's 200 response
        (event type -> schema). Without such a map only the HTTP response is checked."""
        template, response = self.find_response(method, path, 200)
        events = response.get("x-sse-events")
        if events is None:
            media = (response.get("content") or {}).get("text/event-stream") or {}
            events = media.get("x-sse-events")
        if events is None:
            return
        where = f"{method.upper()} {template} SSE event {event!r}"
        if event not in events:
            raise SpecError(f"{where}: undocumented event type (documented: {sorted(events)})")
        self.validate_schema(events[event], data, where)

    def component_schema(self, name: str) -> dict | None:
        self._load()
        return ((self._spec.get("components") or {}).get("schemas") or {}).get(name)
