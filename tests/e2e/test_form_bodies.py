"""Forms through the real proxy: a multipart or URL-encoded body names the model on any
body route, the model server gets the form with its ``model`` rewritten, and a malformed
form is a 400 that loads nothing."""

from __future__ import annotations

import trio

from tests.e2e.conftest import StartProxy
from tests.e2e.harness import running
from tests.e2e.test_proxy import config

MODELS = config(
    """
[models.whisper]
cmd = "${fake}"
useModelName = "whisper-large-v3"
[models.sd]
cmd = "${fake}"
[routing.router.settings.groups.all]
members = ["whisper", "sd"]
swap = false
"""
)


async def test_forms_name_the_model_on_every_body_route(proxy_factory: StartProxy) -> None:
    proxy = await proxy_factory(MODELS)
    async with proxy.client() as client:
        with trio.fail_after(30):
            multipart = await client.post(
                "/v1/audio/transcriptions",
                data={"model": "whisper"},
                files={"file": ("a.wav", b"RIFF....", "audio/wav")},
            )
            assert multipart.status_code == 200, multipart.text
            assert multipart.json() == {
                "text": "fake transcription of 8 bytes",
                "model": "whisper-large-v3",  # useModelName, rewritten in the form
            }

            urlencoded = await client.post(
                "/v1/audio/transcriptions",
                content=b"file=abc&model=whisper&language=en",
                headers={"content-type": "application/x-www-form-urlencoded"},
            )
            assert urlencoded.status_code == 200, urlencoded.text
            assert urlencoded.json() == {
                "text": "fake transcription of 3 bytes",
                "model": "whisper-large-v3",
            }

            # A route that usually takes JSON reads a form as a form: the request reaches
            # sd's server (which has no image routes: its own 404 comes back untouched).
            image = await client.post(
                "/sdapi/v1/img2img",
                data={"model": "sd", "prompt": "a cat"},
                files={"init_image": ("a.png", b"\x89PNG", "image/png")},
            )
            assert image.status_code == 404
            assert image.headers["x-fake-model"] == "sd"
            assert set(await running(client)) == {"whisper", "sd"}

            await client.post("/api/models/unload")
            malformed = await client.post(
                "/v1/audio/transcriptions",
                content=b"model=caf%E9",
                headers={"content-type": "application/x-www-form-urlencoded"},
            )
            assert malformed.status_code == 400
            assert malformed.json()["error"]["message"].startswith("the form is not UTF-8")
            assert await running(client) == {}
