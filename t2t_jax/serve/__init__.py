"""t2t-serve: a trained model behind LibreTranslate's HTTP API, with a page showing the
translation and its attention (docs/serving.md).

api       the request fields, checks and answers as pure functions
detect    which served language a text is in (source=auto, /detect), with py3langid
batching  the bounded queue and the threads that batch concurrent requests
worker    the model (the only module here that calls t2t_jax's decoding)
limits    requests per minute a client or key (fixed windows), the keys file's per-key limits
spec      the OpenAPI 3 document of the routes (GET /spec)
app       the Starlette app: routes, CORS, errors, readiness, metrics
static/   the page (HTML, script, style), served by the app, nothing fetched from elsewhere

Needs the `serve` extra (pip install 't2t_jax[serve]'); the core install does not.
"""
