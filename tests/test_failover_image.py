"""A real failover followed by the hook from the image (issue 21), not the work tree.

The same test as ``tests/test_failover.py``'s graceful stop, with the module's ``hook`` from
:func:`testbed.metacontroller.harness.rig_hook` with ``source="image"``: the image built from the
Dockerfile (:mod:`testbed.metacontroller.image_build`) run as the Deployment runs it
(:mod:`testbed.metacontroller.image`).
The whole failover suite runs that way with ``PGFH_TEST_HOOK_FROM=image``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testbed.metacontroller.gunicorn import GunicornHook
from testbed.metacontroller.harness import Rig, rig_hook
from testbed.metacontroller.image import ImageHook
from tests.test_failover import test_graceful_stop_of_the_leader_moves_the_service as graceful

pytestmark = [pytest.mark.patroni, pytest.mark.image, pytest.mark.slow, pytest.mark.timeout(1500)]


@pytest.fixture(scope="module")
def hook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GunicornHook]:
    with rig_hook(
        tmp_path_factory.mktemp("image-hook"), source="image", workers=2, threads=8
    ) as running:
        yield running


def test_graceful_stop_of_the_leader_moves_the_service_hook_from_the_image(
    rig: Rig, hook: GunicornHook
) -> None:
    assert isinstance(hook, ImageHook) and hook.container is not None
    graceful(rig)
    # The syncs went to the image's gunicorn (its access log), not to some other hook.
    assert "POST /sync" in hook.log_path.read_text()
