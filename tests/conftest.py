"""Test defaults: 8 fake CPU devices for every test, set before JAX is imported."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax


def pytest_configure(config):
    assert jax.device_count() == 8, (
        f"tests expect 8 CPU devices, got {jax.device_count()}: XLA_FLAGS was set too late"
    )
