"""`integrations.instance_hooks.InstanceHooks`: methods replaced on one object, then restored."""

from __future__ import annotations

from integrations.instance_hooks import InstanceHooks


class _Scheduler:
    def schedule(self) -> str:
        return "class"


def test_replacing_touches_one_instance_and_restore_puts_back_what_it_had() -> None:
    plain, own = _Scheduler(), _Scheduler()
    own.schedule = lambda: "instance"  # type: ignore[method-assign]
    other = _Scheduler()
    hooks = InstanceHooks()
    calls: list[str] = []

    def wrapped() -> str:
        calls.append("wrapped")
        return str(first())

    first = hooks.replace(plain, "schedule", wrapped)
    second = hooks.replace(own, "schedule", lambda: "replaced " + second())
    assert plain.schedule() == "class" and calls == ["wrapped"]
    assert own.schedule() == "replaced instance"
    assert other.schedule() == "class" and "schedule" not in vars(other)
    hooks.restore()
    assert "schedule" not in vars(plain) and plain.schedule() == "class"
    assert own.schedule() == "instance"
    hooks.restore()  # a second restore changes nothing
    assert own.schedule() == "instance" and plain.schedule() == "class"
