"""In a real browser: a bad upload is answered beside the field it concerns."""

import pytest

from tests.browser.conftest import log_in

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_kernel_with_the_wrong_extension_is_refused_beside_the_kernel_field(
    live_server, new_page, artifacts_dir, customer, tmp_path
):
    base = live_server.url
    page = new_page()
    log_in(page, base, "alice", "alice-pass")
    page.screenshot(path=str(artifacts_dir / "home_customer.png"), full_page=True)
    page.click("text=New workload")
    page.fill("#id_manifest", 'name = "x"\n')
    bad = tmp_path / "kernel.exe"
    bad.write_bytes(b"MZ\x90\x00")
    page.set_input_files("#id_baseline", str(bad))
    page.click("text=Validate and start")
    error = page.locator("#errors-baseline")
    error.wait_for()
    assert ".ptx" in error.inner_text()
    page.screenshot(path=str(artifacts_dir / "upload_errors.png"), full_page=True)
    # The catalogue tab hides the manifest editor without any script.
    page.click("text=Pick from the catalogue")
    assert page.locator("#id_manifest").is_hidden()
    assert page.locator("#id_shapes").is_visible()
