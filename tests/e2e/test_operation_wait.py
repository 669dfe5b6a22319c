"""GET /v1/operations/{id}?wait_ms= holds the request until the operation is finished."""

import time

import pytest

from sbx_client import check_error_body


def test_wait_returns_the_finished_create_in_one_call(api):
    resp = api.call("POST", "/v1/sandboxes", json_body={}, expect=202)
    sb, op = resp.body["sandbox"], resp.body["operation"]
    api.created_sandboxes.append(sb["id"])
    done = api.get_operation(op["id"], wait_ms=30000)
    assert done["state"] == "succeeded", done
    assert done["completed_at"] is not None
    assert api.get_sandbox(sb["id"])["state"] == "running"

    dop = api.call("DELETE", f"/v1/sandboxes/{sb['id']}", expect=202).body["operation"]
    done = api.get_operation(dop["id"], wait_ms=30000)
    assert done["state"] == "succeeded", done


@pytest.fixture
def finished_op(api) -> str:
    return api.create_sandbox({"labels": {"e2e": "1"}})["operation"]["id"]


def test_wait_on_a_finished_operation_answers_at_once(api, finished_op):
    op_id = finished_op
    t0 = time.monotonic()
    op = api.get_operation(op_id, wait_ms=60000)
    assert op["state"] == "succeeded"
    assert time.monotonic() - t0 < 10, "a finished operation must not be held until wait_ms"


@pytest.mark.parametrize("value", ["-1", "60001", "abc", "1.5", "", "99999999999999999999"])
def test_bad_wait_ms_is_400_naming_the_field(api, finished_op, value):
    op_id = finished_op
    resp = api.call("GET", f"/v1/operations/{op_id}", params={"wait_ms": value}, expect=400)
    check_error_body(resp, resp.body, "invalid_argument", field="wait_ms")


def test_wait_on_unknown_operation_is_404_at_once(api):
    t0 = time.monotonic()
    resp = api.call("GET", "/v1/operations/op_aaaaaaaaaaaaaaaaaaaa", params={"wait_ms": "30000"},
                    expect=404)
    check_error_body(resp, resp.body, "not_found")
    assert time.monotonic() - t0 < 10
