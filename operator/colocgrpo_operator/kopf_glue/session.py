"""kopf's aiohttp session, authenticated from the same Credentials as the operator's own client.

The token is set on each request by a client middleware rather than once as a session header:
a ServiceAccount's projected token rotates and an exec plugin's token expires, and the
middleware asks the credentials for the current one each time (in a thread only when that
means reading a file or running the plugin). A 401 makes it drop the refused token and send
the request once more with a new one; kopf's own re-login (the login handler) is the fallback.
"""

from __future__ import annotations

import asyncio

import aiohttp
import kopf

from colocgrpo_operator.kube.credentials import Credentials


def auth_middleware(credentials: Credentials) -> aiohttp.ClientMiddlewareType:
    async def authenticate(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        for attempt in range(2):
            known, token = credentials.cached_token()
            if not known:
                token = await asyncio.to_thread(credentials.bearer_token)
            if token:
                request.headers["Authorization"] = f"Bearer {token}"
            response = await handler(request)
            if response.status != 401 or attempt or not await asyncio.to_thread(credentials.refused, token):
                return response
            response.release()
        raise AssertionError("not reached: the second attempt always returns")

    return authenticate


def kopf_session(credentials: Credentials, connection_limit: int, trust_env: bool) -> kopf.AiohttpSession:
    """A kopf session for these credentials with at most `connection_limit` connections (0: no
    limit). kopf closes it with its own."""
    return kopf.AiohttpSession(
        aiohttp_session=aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connection_limit, ssl=credentials.ssl_context()),
            middlewares=(auth_middleware(credentials),),
            proxy=credentials.proxy_url,
            trust_env=trust_env,
        ),
        server=credentials.server,
        default_namespace=credentials.namespace,
    )
