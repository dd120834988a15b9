"""The chat page at / in a real browser: headless Chromium (Debian's ``chromium`` and ``chromium-driver``, which
.ci/run installs) opens it, sends a message, and sees the reply stream in; a second turn keeps the first."""

import shutil

import pytest

API_KEY = "test-key-0123456789"  # conftest's

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER),
                                reason="headless browser test: needs Debian's chromium and chromium-driver "
                                       "(apt-get install -y chromium chromium-driver; .ci/run does)")

# Counts the changes of the newest assistant bubble's text, so the test can tell a streamed reply (several
# changes) from one that arrived whole.
WATCH = """
window.__changes = 0;
new MutationObserver(() => { window.__changes += 1; })
  .observe(document.getElementById('messages'), {subtree: true, characterData: true, childList: true});
"""


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1000,700"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    yield driver
    driver.quit()


def test_page_streams_a_reply_and_keeps_the_conversation(browser, live, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(live.root + "/")
    key = browser.find_element(By.ID, "key")
    key.send_keys(API_KEY)
    browser.execute_script("document.getElementById('key').dispatchEvent(new Event('change'))")
    WebDriverWait(browser, 30).until(lambda d: d.find_element(By.ID, "model").text == live.served.name)
    browser.find_element(By.ID, "max-tokens").clear()
    browser.find_element(By.ID, "max-tokens").send_keys("40")
    browser.execute_script(WATCH)
    box = browser.find_element(By.ID, "input")
    box.send_keys("你好")
    box.send_keys(Keys.ENTER)

    def done(driver):
        replies = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant[data-state=done]")
        return replies[-1] if replies else False

    reply = WebDriverWait(browser, 60).until(done)
    assert reply.text.strip()
    assert not browser.find_elements(By.CSS_SELECTOR, ".msg.error")
    assert browser.execute_script("return window.__changes") > 3  # the text grew piece by piece
    box.send_keys("再见")
    box.send_keys(Keys.ENTER)
    WebDriverWait(browser, 60).until(lambda d: len(d.find_elements(By.CSS_SELECTOR,
                                                                   ".msg.assistant[data-state=done]")) == 2)
    assert browser.execute_script("return conversation.map(m => m.role)") == ["user", "assistant"] * 2
    assert [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".msg.user")] == ["你好", "再见"]
    shot = tmp_path / "glm-serve-page.png"
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 1000
    print(f"screenshot: {shot}")


def test_page_shows_an_error_for_a_wrong_key(browser, live):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(live.root + "/")
    browser.find_element(By.ID, "key").send_keys("wrong")
    browser.execute_script("document.getElementById('key').dispatchEvent(new Event('change'))")
    browser.find_element(By.ID, "input").send_keys("hi\n")
    error = WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.error"))
    assert "API key" in error[0].text
