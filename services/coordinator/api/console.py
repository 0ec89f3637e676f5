"""The browser console under /ui and the API docs under /docs and /redoc, all served from files
shipped in Python packages: no page loads anything from another host, so both work on a cluster
without outside access.

The console's files (services/coordinator/ui/) hold no data and need no token; the console asks
for the API token in the browser and sends it on every /v1 request, as any API client does.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

UI_DIR = Path(__file__).resolve().parents[1] / "ui"
DOCS_ASSETS = "/docs-assets"


def docs_assets_dir() -> Path:
    """Swagger UI's and ReDoc's files, as the fastapi-offline package ships them."""
    return Path(str(resources.files("fastapi_offline") / "static"))


def mount_console(app: FastAPI) -> None:
    """Adds /ui (the console), /docs, /redoc and the files they load. `app` must have been created
    with docs_url=None and redoc_url=None."""
    title = app.title
    openapi_url = app.openapi_url or "/openapi.json"
    app.mount(DOCS_ASSETS, StaticFiles(directory=docs_assets_dir()), name="docs-assets")
    app.mount("/ui/", StaticFiles(directory=UI_DIR, html=True), name="ui")

    @app.get("/ui", include_in_schema=False)
    async def console_root() -> RedirectResponse:
        return RedirectResponse("/ui/")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url, title=f"{title}: API", oauth2_redirect_url="/docs/oauth2-redirect",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js", swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png")

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url=openapi_url, title=f"{title}: API",
                              redoc_js_url=f"{DOCS_ASSETS}/redoc.standalone.js",
                              redoc_favicon_url=f"{DOCS_ASSETS}/favicon.png", with_google_fonts=False)
