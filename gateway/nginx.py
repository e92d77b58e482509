"""The nginx configuration of the shared mode (nginx from the distribution: auth_request, map and TLS
are all built in).

Every location except the sign-in pages and the fine-tuning API (``/v1/``, whose every request carries a studio
API token that gateway/api.py checks) goes through ``auth_request /auth/check``; nginx then sets
``X-Studio-User`` from the sign-in service's answer, replacing whatever the browser sent. Requests
whose Origin is another site are refused (403) before anything else, and a WebSocket upgrade must
carry an Origin at all. Uploads are capped at the dashboard's own limit. No page may be framed by
another (clickjacking: X-Frame-Options and CSP frame-ancestors). Wrong passwords are limited by the
sign-in service itself, per client address, so that successful sign-ins never count.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

UPLOAD_LIMIT_MB = 200  # the same as server.maxUploadSize in .streamlit/config.toml


@dataclass
class Layout:
    listen_host: str
    listen_port: int
    streamlit_port: int
    signin_port: int
    api_port: int  # the fine-tuning API (gateway/api.py): /v1/, checked by its own tokens
    run_dir: Path  # pid, logs, temp files
    tls_cert: str = ""
    tls_key: str = ""
    public_url: str = ""  # an origin browsers use in front of nginx (a TLS terminator), also accepted


_PROXY_HEADERS = """
            proxy_http_version 1.1;
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_set_header X-Forwarded-Proto $scheme;"""

_TO_STREAMLIT = """
            auth_request /auth/check;
            auth_request_set $studio_user $upstream_http_x_studio_user;
            auth_request_set $studio_session $upstream_http_x_studio_session;
            error_page 401 = @signin;
            proxy_pass http://streamlit;""" + _PROXY_HEADERS + """
            proxy_set_header X-Studio-User $studio_user;  # replaces any value the client sent
            proxy_set_header X-Studio-Session $studio_session;  # the dashboard checks it against the users table
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_read_timeout 1d;
            proxy_buffering off;"""


def render(layout: Layout) -> str:
    run = layout.run_dir
    tls = bool(layout.tls_cert)
    listen = f"listen {layout.listen_host}:{layout.listen_port}{' ssl' if tls else ''};"
    tls_lines = (f"""
        ssl_certificate {layout.tls_cert};
        ssl_certificate_key {layout.tls_key};
        ssl_protocols TLSv1.2 TLSv1.3;
        add_header Strict-Transport-Security "max-age=31536000" always;""" if tls else "")
    public = (f'\n        "~^{re.escape(layout.public_url)}\\|" 0;' if layout.public_url else "")
    temp = "\n".join(f"    {kind}_temp_path {run / 'tmp' / kind};" for kind in
                     ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""# Written by `python -m gateway` (make share) at each start; edits are lost.
daemon off;
worker_processes 1;
pid {run / 'nginx.pid'};
error_log {run / 'nginx-error.log'} warn;
events {{ worker_connections 1024; }}

http {{
    # No query strings in the log: the OIDC callback's one-time code and state stay out of it.
    log_format studio '$remote_addr [$time_local] "$request_method $uri $server_protocol" $status $body_bytes_sent';
    access_log {run / 'nginx-access.log'} studio;
{temp}
    server_tokens off;

    map $http_upgrade $connection_upgrade {{ default upgrade; "" close; }}
    # 1 when the request carries an Origin that is not this site (scheme://host:port as the browser saw it)
    map "$http_origin|$scheme://$http_host" $foreign_origin {{
        "~^\\|" 0;
        "~^(?<origin>[^|]+)\\|\\k<origin>$" 0;{public}
        default 1;
    }}
    # Only a page load is sent to the sign-in page; everything else gets a bare 401 from nginx itself,
    # without proxying, so the body of a stranger's upload is never read into a buffer.
    map "$request_method:$http_accept" $page_load {{ "~^(GET|HEAD):.*text/html" 1; default 0; }}

    upstream streamlit {{ server 127.0.0.1:{layout.streamlit_port}; }}
    upstream signin {{ server 127.0.0.1:{layout.signin_port}; }}
    upstream api {{ server 127.0.0.1:{layout.api_port}; }}

    server {{
        {listen}{tls_lines}
        client_max_body_size {UPLOAD_LIMIT_MB}m;
        add_header X-Content-Type-Options nosniff always;
        add_header Referrer-Policy same-origin always;
        add_header X-Frame-Options DENY always;
        add_header Content-Security-Policy "frame-ancestors 'none'" always;

        if ($foreign_origin) {{ return 403; }}  # another site's page: no WebSocket, no upload, no sign-in post

        location = /auth/check {{
            internal;
            proxy_pass http://signin;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
        }}
        location @signin {{  # a request that failed the check: page loads go to the sign-in page
            if ($page_load = 0) {{ return 401; }}
            rewrite ^ /auth/start? break;
            proxy_method GET;
            proxy_pass http://signin;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header X-Original-URI $request_uri;
            proxy_set_header X-Original-Method $request_method;
        }}
        location = /auth/start {{ internal; proxy_pass http://signin; }}
        location /auth/ {{
            client_max_body_size 16k;
            proxy_pass http://signin;{_PROXY_HEADERS}
        }}
        location /v1/ {{  # the OpenAI-compatible API: every request carries an API token, which it checks itself
            proxy_pass http://api;{_PROXY_HEADERS}
            proxy_read_timeout 1h;  # a chat request waits for its model's server to load
            proxy_buffering off;  # streamed chat answers reach the client as they come
            proxy_request_buffering off;
        }}
        location = /_stcore/stream {{
            if ($http_origin = "") {{ return 403; }}  # browsers always send Origin on a WebSocket upgrade
{_TO_STREAMLIT}
        }}
        location / {{
{_TO_STREAMLIT}
        }}
    }}
}}
"""
