"""Users, grants and tokens against the real broker, as its admin and as the users it makes.

Skipped with a broker that predates users (its ``serve`` has no ``--admin-password-file``).
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path
from typing import Any

import pytest

import ferrymq
from ferrymq import Action, BrokerError, Role

from conftest import run

ADMIN_PASSWORD = "admin-pass-0123"
BILLING_PASSWORD = "billing-pass-4567"


@pytest.fixture
def secure_broker(binary: Path, make_broker: Any, tmp_path: Path) -> Any:
    helptext = subprocess.run([str(binary), "serve", "--help"], capture_output=True, text=True).stdout
    if "--admin-password-file" not in helptext:
        pytest.skip(f"{binary} predates users and grants")
    secret = tmp_path / "admin.pass"
    secret.write_text(ADMIN_PASSWORD + "\n")
    return make_broker("--admin-password-file", str(secret))


def test_users_grants_and_tokens(secure_broker: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    addr = secure_broker.addr

    async def go() -> str:
        async with ferrymq.Client(addr, user="admin", password=ADMIN_PASSWORD, reconnect=False) as admin:
            await admin.create_topic("orders.eu")
            await admin.create_topic("audit")
            await admin.add_user("billing", BILLING_PASSWORD)
            await admin.add_user("grafana", "watch-it-all", roles="monitor")
            await admin.grant("billing", "orders.*", Action.PUBLISH | Action.CONSUME)
            await admin.grant("billing", "audit", "inspect")
            users = {u.name: u for u in await admin.list_users()}
            assert users["admin"].roles & Role.ADMIN
            assert users["grafana"].roles == Role.MONITOR
            assert sorted(users["billing"].grants) == [("audit", Action.INSPECT), ("orders.*", 3)]
            with pytest.raises(BrokerError) as caught:
                await admin.add_user("billing", BILLING_PASSWORD)
            assert caught.value.name == "conflict"

        async with ferrymq.Client(addr, user="billing", password=BILLING_PASSWORD, reconnect=False) as billing:
            await billing.publish("orders.eu", b"x")
            # It sees audit (inspect) but may not publish to it.
            with pytest.raises(BrokerError) as caught:
                await billing.publish("audit", b"x")
            assert caught.value.name == "forbidden" and caught.value.code == 21
            with pytest.raises(BrokerError) as caught:
                await billing.list_users()
            assert caught.value.name == "forbidden"
            created = await billing.create_token("deploy")
            assert created.name == "deploy" and created.expires_ms == 0
            assert created.token not in repr(created)
            tokens = await billing.list_tokens()
            assert [t.name for t in tokens] == ["deploy"] and tokens[0].created_ms > 0
            await billing.set_password("billing-pass-new")
            token = created.token

        async with ferrymq.Client(addr, token=token, reconnect=False) as by_token:
            await by_token.publish("orders.eu", b"y")

        async with ferrymq.Client(addr, user="admin", password=ADMIN_PASSWORD, reconnect=False) as admin:
            await admin.revoke("billing", "orders.*", "publish")
            assert [t.name for t in await admin.list_tokens("billing")] == ["deploy"]
            await admin.revoke_token("deploy", user="billing")
            assert await admin.list_tokens("billing") == []
            users = {u.name: u for u in await admin.list_users()}
            assert sorted(users["billing"].grants) == [("audit", 4), ("orders.*", Action.CONSUME)]
            await admin.remove_user("grafana")
            assert "grafana" not in {u.name for u in await admin.list_users()}

        with pytest.raises(BrokerError) as caught:
            async with ferrymq.Client(addr, user="billing", password=BILLING_PASSWORD, reconnect=False):
                pass
        assert caught.value.name == "authentication_failed"
        return token

    token = run(go())
    for secret in (token, ADMIN_PASSWORD, BILLING_PASSWORD, "billing-pass-new", "watch-it-all"):
        assert secret not in caplog.text


def test_role_and_action_names() -> None:
    from ferrymq.aio import _bits

    assert _bits("publish|consume", Action) == 3
    assert _bits(["inspect", "manage"], Action) == 12
    assert _bits(Role.ADMIN | Role.MONITOR, Role) == 3
    assert _bits("", Role) == 0
    with pytest.raises(ValueError, match="unknown action 'write'"):
        _bits("write", Action)
    with pytest.raises(ValueError):
        _bits(256, Action)


def test_sync_client_administers_users(secure_broker: Any) -> None:
    with ferrymq.sync.Client(secure_broker.addr, user="admin", password=ADMIN_PASSWORD, reconnect=False) as admin:
        admin.add_user("shop", "shop-pass-890")
        admin.grant("shop", "*", ["publish", "inspect"])
        admin.revoke("shop", "*", "inspect")
        created = admin.create_token("ci", user="shop", expires_ms=4_102_444_800_000)
        assert created.expires_ms == 4_102_444_800_000
        assert [t.name for t in admin.list_tokens("shop")] == ["ci"]
        admin.revoke_token("ci", user="shop")
        admin.set_password("shop-pass-new", user="shop")
        (shop,) = [u for u in admin.list_users() if u.name == "shop"]
        assert (shop.roles, shop.tokens, shop.grants) == (0, 0, [("*", Action.PUBLISH)])
        admin.remove_user("shop")
