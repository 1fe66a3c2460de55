"""The microphone page in a real browser: Debian's Chromium, headless, its microphone a fake device playing a
mini-corpus file, driven by selenium through chromedriver.

The page captures the fake microphone (AudioWorklet at 16 kHz), streams it to ``ssm-serve`` and shows the partial
and final transcripts. The browser resamples the file (its fake device runs at 48 kHz) and the capture starts a few
10 ms blocks into it, so the server does not hear the file's exact samples: the test checks that what it heard
(``--save-audio``) is the file (each eighth of a second of it found in order by normalized cross-correlation, so
that a block the loaded machine's fake device dropped does not fail the test), and that the page shows the final
transcript that offline decoding gives for that audio, which is what the server sent. (With a trained model the
transcript of the file itself is shown; docs/server.md reports that check with the mini recipe's streaming model.)
Then the page's two failures: a refused microphone, and a server that goes away mid-stream.

Chromium is installed as ``.ci/run`` installs it (``apt-get install -y chromium chromium-driver``) when missing;
the test skips, saying why, only if it cannot be.
"""
from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from serve_cases import (SEARCH, SEARCH_FLAGS, aligned_windows, start_command, stop_command,  # noqa: F401
                         streaming_model)

from ssm_fairseq.asr import Recognizer

pytestmark = pytest.mark.slow

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
HEADLESS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--window-size=900,760", "--autoplay-policy=no-user-gesture-required"]


def _install_chromium() -> None:
    """Chromium and chromedriver, installed with apt-get when missing; ``pytest.skip`` naming why if impossible."""
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return
    if shutil.which("apt-get") is None:
        pytest.skip("Chromium is not installed (/usr/bin/chromium, /usr/bin/chromedriver) and there is no apt-get to "
                    "install it: apt-get install -y chromium chromium-driver")
    for command in (["apt-get", "update", "-q"],
                    ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium", "chromium-driver"]):
        done = subprocess.run(command, capture_output=True, text=True,
                              env={"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        if done.returncode:
            pytest.skip(f"Chromium is not installed and {' '.join(command)} failed ({done.returncode}): "
                        f"{done.stderr.strip().splitlines()[-1:] or ''}")
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip("apt-get installed chromium and chromium-driver, but /usr/bin/chromium or /usr/bin/chromedriver "
                    "is missing")


@pytest.fixture(scope="module")
def browser_factory(tmp_path_factory):
    """``open(*flags)`` -> a new headless Chromium (selenium WebDriver) with a fresh profile; all quit at the end."""
    _install_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    drivers = []

    def open_browser(*flags: str):
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in [*HEADLESS, f"--user-data-dir={tmp_path_factory.mktemp('chromium_profile')}", *flags]:
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
        drivers.append(driver)
        return driver

    yield open_browser
    for driver in drivers:
        driver.quit()


def _fake_microphone(path: Path) -> list[str]:
    """Chromium's flags for a microphone playing ``path`` once (a WAV file), granted without asking."""
    return ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={path}%noloop"]


def _wait(driver, condition, timeout: float, what: str):
    from selenium.webdriver.support.ui import WebDriverWait
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.05).until(condition)
    except Exception as error:
        page = driver.find_element("tag name", "body").text
        raise AssertionError(f"waiting for {what}: {error!r}; the page shows:\n{page}") from None


def _text(driver, element_id: str) -> str:
    """The element's text as the page set it (``textContent``: runs of spaces kept, which rendering collapses)."""
    return driver.execute_script(f"return document.getElementById({element_id!r}).textContent")


def test_the_page_shows_the_transcript_of_the_fake_microphone(streaming_model, browser_factory, tmp_path):
    path = streaming_model.files[0]
    samples, rate = sf.read(str(path), dtype="int16")
    wav = tmp_path / "microphone.wav"
    sf.write(wav, samples, rate, subtype="PCM_16")  # Chromium's fake device reads WAV
    heard_dir = tmp_path / "heard"
    heard_dir.mkdir()
    process, port = start_command(streaming_model.checkpoint, *SEARCH_FLAGS, "--save-audio", str(heard_dir))
    try:
        driver = browser_factory(*_fake_microphone(wav))
        driver.get(f"http://localhost:{port}/")
        driver.find_element("id", "start").click()
        _wait(driver, lambda d: d.find_element("id", "stop").is_enabled(), 30, "the page to listen")
        partials = set()
        deadline = time.monotonic() + len(samples) / rate + 1.0
        while time.monotonic() < deadline:  # the file plays; the partial transcript changes as it does
            partials.add(_text(driver, "partial"))
            time.sleep(0.05)
        driver.find_element("id", "stop").click()
        _wait(driver, lambda d: d.find_element("id", "final").get_attribute("data-done") == "true", 60,
              "the final transcript")
        shown, error = _text(driver, "final"), _text(driver, "error")
        segments = driver.execute_script(
            "return [...document.querySelectorAll('#segments li')].map((item) => item.textContent)")
        driver.save_screenshot(str(tmp_path / "serve_page.png"))
    finally:
        code, stderr = stop_command(process)
    assert code == 0, stderr
    assert error == ""
    heard, heard_rate = sf.read(str(heard_dir / "1.wav"), dtype="float32")
    sent = samples.astype(np.float32) / 32768
    # each eighth of a second of the file from 0.3 s on (the capture may begin that late), where it was heard
    assert heard_rate == 16000 and len(heard) > len(sent) - 0.3 * rate  # the file, but for blocks before the capture
    windows = aligned_windows(heard, sent, rate // 8, first=3 * rate // 10)
    correlations, lags = np.array([c for c, _ in windows]), np.array([lag for _, lag in windows])
    assert len(windows) >= 0.5 * (len(sent) - 0.3 * rate) / (rate // 8), windows
    matched = correlations > 0.7  # a window a glitch spoiled matches nowhere in particular: its lag says nothing
    assert np.median(correlations) > 0.85 and np.mean(matched) >= 0.75, windows  # the file's audio
    lags = lags[matched]
    assert np.all((-0.3 * rate < lags) & (lags < 0.2 * rate)) and np.all(np.diff(lags) > -0.05 * rate), windows
    offline = Recognizer(streaming_model.checkpoint, device="cpu", **SEARCH).transcribe([heard_dir / "1.wav"])[0]
    assert offline and shown == offline
    assert len(segments) == 1 and segments[0].endswith(offline) and segments[0].startswith("0.00–")
    assert len(partials - {""}) >= 2  # the partial transcript was shown as it changed


def test_the_page_says_so_when_the_microphone_is_refused(streaming_model, browser_factory):
    process, port = start_command(streaming_model.checkpoint, *SEARCH_FLAGS)
    try:
        driver = browser_factory("--use-fake-device-for-media-stream", "--deny-permission-prompts")
        driver.get(f"http://localhost:{port}/")
        driver.find_element("id", "start").click()
        _wait(driver, lambda d: d.find_element("id", "error").is_displayed(), 30, "the error")
        assert "Microphone access was refused" in _text(driver, "error")
        assert driver.find_element("id", "start").is_enabled()  # Start again, once allowed
    finally:
        code, stderr = stop_command(process)
    assert code == 0, stderr


def test_the_page_says_so_when_the_server_goes_away(streaming_model, browser_factory, tmp_path):
    samples, rate = sf.read(str(streaming_model.files[1]), dtype="int16")
    wav = tmp_path / "microphone.wav"
    sf.write(wav, np.tile(samples, 20), rate, subtype="PCM_16")
    process, port = start_command(streaming_model.checkpoint, *SEARCH_FLAGS)
    try:
        driver = browser_factory(*_fake_microphone(wav))
        driver.get(f"http://localhost:{port}/")
        driver.find_element("id", "start").click()
        _wait(driver, lambda d: d.find_element("id", "stop").is_enabled(), 30, "the page to listen")
        time.sleep(1.0)
        process.send_signal(signal.SIGKILL)  # not a graceful shutdown: the connection just drops
        _wait(driver, lambda d: d.find_element("id", "error").is_displayed(), 30, "the error")
        assert "connection to the server was lost" in _text(driver, "error")
        assert driver.find_element("id", "start").is_enabled() and not driver.find_element("id", "stop").is_enabled()
    finally:
        process.kill()
        process.communicate()
