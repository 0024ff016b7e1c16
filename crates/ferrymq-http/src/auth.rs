//! Who may do what over HTTP: the `Host` and `Origin` checks every request passes, the
//! credentials (`Authorization: Basic` or `Bearer <token>`), and the mapping of each route onto
//! the broker's one authorisation function ([`ferrymq_broker::Access`]).
//!
//! - While the broker is open (no users) and listens on loopback, `Host` must be a name it
//!   answers to: an IP literal, `localhost`, or one given with `--http-host`. A page that rebinds
//!   its own DNS name to 127.0.0.1 sends its own name, and is refused. Once users exist such a
//!   page has no credentials (a browser keeps them per origin); a broker listening beyond
//!   loopback is reached by whatever names its network gives it.
//! - A request that changes state (anything but GET and HEAD), and every stream (SSE,
//!   WebSocket), is refused when it carries an `Origin` other than the broker's own: no web page
//!   can drive a broker through its visitor's browser, even with a `text/plain` POST that needs
//!   no preflight.
//! - Credentials are an `Authorization` header, or else the dashboard's session cookie, which
//!   a state-changing request must back with its CSRF token (`session`); a page's script is
//!   never offered `Basic`, whose challenge would open the browser's own password prompt.
//! - Public without credentials: `/ping` and `/openapi.json` (no broker state in either), the
//!   health routes `/livez` and `/readyz`, and `/login` and `/session`, which check their own.
//!   `/metrics`, `/node` and `/history` need the monitor or admin role; everything else an authenticated user, and the
//!   route's action on its topic.
//! - A refusal for missing or bad credentials is 401 with `WWW-Authenticate`; for a right the
//!   user lacks, 403 `forbidden`; for a topic the user cannot see, 404 `unknown_topic`, as if it
//!   did not exist.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use ferrymq_broker::{Access, Action, BrokerError, Identity};
use futures_util::future::Either;
use parking_lot::Mutex;
use tracing::Instrument;

use crate::{ApiError, AppState, Connection};

/// The peer of a request, put in its extensions by the listener.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer(pub SocketAddr);

/// Whether a request's connection is over TLS, put in its extensions by the listener.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OverTls(pub bool);

/// The user a verified client certificate of the connection names (mutual TLS), put in a
/// request's extensions by the listener: who the request is when it carries no credentials.
#[derive(Debug, Clone)]
pub(crate) struct CertificateUser(pub Arc<str>);

/// The authenticated caller of a request, for handlers that filter or check themselves.
#[derive(Clone)]
pub struct Caller(Arc<Mutex<Access>>);

impl Caller {
    pub(crate) fn new(access: Access) -> Caller {
        Caller(Arc::new(Mutex::new(access)))
    }

    /// Whether the caller may see `topic` in listings and statistics.
    pub(crate) fn sees(&self, topic: &str) -> bool {
        self.0.lock().sees(topic).unwrap_or(false)
    }

    pub(crate) fn check(&self, action: Action, topic: &str) -> Result<(), ApiError> {
        Ok(self.0.lock().check(action, topic)?)
    }

    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut Access) -> T) -> T {
        f(&mut self.0.lock())
    }

    /// A fresh view of the same identity, for a stream that outlives the request.
    pub(crate) fn access(&self) -> Access {
        let access = self.0.lock();
        Access::new(access.auth().clone(), access.identity().clone())
    }
}

/// Routes anyone may call without credentials: `/login` checks its own, and `/session` answers
/// whether there is a session.
const PUBLIC_PATHS: [&str; 6] = [
    "/ping",
    "/openapi.json",
    "/livez",
    "/readyz",
    "/login",
    "/session",
];

/// What `WWW-Authenticate` offers.
const CHALLENGE: &str = "Basic realm=\"ferrymq\", Bearer realm=\"ferrymq\"";

/// Credentials as sent: a user and a password, or (empty user) a token.
pub(crate) struct Credentials {
    pub(crate) user: String,
    pub(crate) secret: String,
}

fn unauthorized(message: impl Into<String>) -> Response {
    let mut response = ApiError::new(
        StatusCode::UNAUTHORIZED,
        ferrymq_protocol::ErrorCode::AuthenticationFailed.as_str(),
        message,
    )
    .into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(CHALLENGE),
    );
    response
}

/// The credentials of `Authorization`, none when it is absent, or why it cannot be read (never
/// quoting the secret).
pub(crate) fn credentials(headers: &HeaderMap) -> Result<Credentials, String> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(Credentials {
            user: String::new(),
            secret: String::new(),
        });
    };
    let value = value
        .to_str()
        .map_err(|_| "malformed Authorization header: not visible ASCII".to_owned())?;
    let (scheme, rest) = value.split_once(' ').unwrap_or((value, ""));
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        if rest.is_empty() {
            return Err("malformed Authorization header: Bearer needs a token".to_owned());
        }
        return Ok(Credentials {
            user: String::new(),
            secret: rest.to_owned(),
        });
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(rest)
            .map_err(|_| "malformed Authorization header: Basic needs base64 of user:password")?;
        let text = String::from_utf8(decoded)
            .map_err(|_| "malformed Authorization header: Basic credentials are not UTF-8")?;
        let (user, password) = text
            .split_once(':')
            .ok_or("malformed Authorization header: Basic needs user:password")?;
        if user.is_empty() {
            return Err("malformed Authorization header: Basic needs a user name".to_owned());
        }
        return Ok(Credentials {
            user: user.to_owned(),
            secret: password.to_owned(),
        });
    }
    Err(format!(
        "unsupported Authorization scheme '{scheme}': use Basic or Bearer"
    ))
}

/// `Host` names the broker answers to, or why not (see the module doc for when it is checked).
fn check_host(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    if state.broker.auth().enabled() || !state.config.addr.ip().is_loopback() {
        return Ok(());
    }
    host_allowed(headers, &state.config.allowed_hosts)
}

fn host_allowed(headers: &HeaderMap, allowed: &[String]) -> Result<(), ApiError> {
    let Some(host) = headers.get(header::HOST) else {
        return Ok(());
    };
    let host = host.to_str().unwrap_or("");
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    let answers = name.parse::<std::net::IpAddr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(name));
    if answers {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::MISDIRECTED_REQUEST,
        "unknown_host",
        format!(
            "this broker does not answer to the name '{name}': use an IP address or localhost, \
             or start it with --http-host {name}"
        ),
    ))
}

/// Refuses a request from a page of another site (see the module doc).
fn check_origin(method: &Method, path: &str, headers: &HeaderMap) -> Result<(), ApiError> {
    let stream = path.ends_with("/stream") || path.ends_with("/ws");
    if (method == Method::GET || method == Method::HEAD) && !stream {
        return Ok(());
    }
    let refuse = |why: String| {
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden_origin",
            format!("{why}: requests from web pages of other sites are refused"),
        ))
    };
    if let Some(site) = headers.get("sec-fetch-site") {
        if site.as_bytes() == b"cross-site" {
            return refuse("cross-site request".to_owned());
        }
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("null");
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let origin_host = origin.split_once("://").map(|(_, rest)| rest);
    match origin_host {
        Some(origin_host) if origin_host.eq_ignore_ascii_case(host) => Ok(()),
        _ => refuse(format!("Origin '{origin}' is not this broker ({host})")),
    }
}

/// The action a route needs on the topic in its path, if it names one.
fn route_action(method: &Method, route: &str) -> Option<Action> {
    use Action::*;
    Some(match (method.as_str(), route) {
        ("GET", "/topics/{topic}") => Inspect,
        ("DELETE", "/topics/{topic}") => Manage,
        ("GET", "/topics/{topic}/stats") => Inspect,
        ("GET", "/topics/{topic}/history") => Inspect,
        ("POST", "/topics/{topic}/messages") => Publish,
        ("GET", "/topics/{topic}/messages/{id}") => Inspect,
        ("GET", "/topics/{topic}/subscriptions/{subscription}/messages") => Inspect,
        ("DELETE", "/topics/{topic}/subscriptions/{subscription}") => Manage,
        ("POST", "/topics/{topic}/requeue") => Manage,
        ("POST", "/topics/{topic}/purge") => Purge,
        ("POST", "/topics/{topic}/subscriptions/{subscription}/pause") => Pause,
        ("POST", "/topics/{topic}/subscriptions/{subscription}/resume") => Pause,
        (_, r) if r.starts_with("/topics/{topic}/subscriptions/{subscription}/") => Consume,
        _ => return None,
    })
}

/// The topic segment of a `/topics/{topic}...` path, percent-decoded as the router decodes it.
fn path_topic(path: &str) -> Option<String> {
    let segment = path.strip_prefix("/topics/")?.split('/').next()?;
    // A malformed escape makes no topic (the router would keep it as it is, but no topic name
    // holds a `%`).
    let bytes = segment.as_bytes();
    let malformed = bytes.iter().enumerate().any(|(i, &b)| {
        b == b'%'
            && !bytes
                .get(i + 1..i + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    });
    if malformed {
        return None;
    }
    percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .ok()
        .map(Cow::into_owned)
}

/// Authenticates `credentials`: from the remembered verifications, or with a full check on the
/// blocking pool; a failure is answered late when its address keeps failing.
async fn authenticate(
    state: &AppState,
    peer: Option<SocketAddr>,
    certificate: Option<&CertificateUser>,
    credentials: Credentials,
) -> Result<Identity, Response> {
    let auth = state.broker.auth().clone();
    if let (Some(certificate), true, true) = (
        certificate,
        credentials.user.is_empty(),
        credentials.secret.is_empty(),
    ) {
        return auth
            .authenticate_certificate(&certificate.0)
            .map_err(|error| unauthorized(error.to_string()));
    }
    if let Some(identity) = auth.remembered(&credentials.user, &credentials.secret) {
        return Ok(identity);
    }
    let checker = auth.clone();
    let user = credentials.user.clone();
    // Sending no credentials is not guessing any: only attempts count towards slowing down.
    let attempt = !(credentials.user.is_empty() && credentials.secret.is_empty());
    // Only a password check is slow (Argon2id); no credentials and tokens are answered here.
    let result = if credentials.user.is_empty() {
        checker.authenticate(&credentials.user, &credentials.secret)
    } else {
        tokio::task::spawn_blocking(move || {
            checker.authenticate_and_remember(&credentials.user, &credentials.secret)
        })
        .await
        .unwrap_or_else(|_| Err(BrokerError::AuthenticationFailed("interrupted".into())))
    };
    match result {
        Ok(identity) => {
            if let Some(peer) = peer {
                auth.login_succeeded(peer.ip());
            }
            Ok(identity)
        }
        Err(error) => {
            if let Some(peer) = peer.filter(|_| attempt) {
                let delay = auth.login_failed(peer.ip());
                tracing::warn!(peer = %peer, %user, delay_ms = delay.as_millis() as u64, "HTTP authentication failed");
                tokio::time::sleep(delay).await;
            }
            Err(unauthorized(error.to_string()))
        }
    }
}

/// Checks a user's password as every request's credentials are checked, for `POST /login`.
pub(crate) async fn authenticate_password(
    state: &AppState,
    peer: Option<SocketAddr>,
    user: String,
    password: String,
) -> Result<Identity, Response> {
    let credentials = Credentials {
        user,
        secret: password,
    };
    authenticate(state, peer, None, credentials).await
}

/// Whether a request comes from a script of a page (`fetch`): its 401 then offers only
/// `Bearer`, since a `Basic` challenge would make the browser open its own password prompt over
/// the dashboard's login.
fn from_script(headers: &HeaderMap) -> bool {
    headers
        .get("sec-fetch-dest")
        .is_some_and(|dest| dest.as_bytes() == b"empty")
}

fn challenge_for_script(mut response: Response) -> Response {
    if response.status() == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"ferrymq\""),
        );
    }
    response
}

/// Who a request acts as: its `Authorization`, else its session cookie (checked for its CSRF
/// token when the request changes state), else its client certificate (mutual TLS), else nobody
/// (anonymous on a broker without users).
async fn identify(
    state: &AppState,
    peer: Option<SocketAddr>,
    certificate: Option<&CertificateUser>,
    method: &Method,
    headers: &HeaderMap,
) -> Result<Identity, Response> {
    if !headers.contains_key(header::AUTHORIZATION) {
        match crate::session_store::from_request(
            &state.sessions,
            state.broker.auth(),
            method,
            headers,
        ) {
            Ok(Some(found)) => return Ok(found.identity),
            Ok(None) => {}
            Err(error) if error.status == StatusCode::UNAUTHORIZED => {
                return Err(unauthorized(error.message))
            }
            Err(error) => return Err(error.into_response()),
        }
    }
    let credentials = credentials(headers).map_err(unauthorized)?;
    authenticate(state, peer, certificate, credentials).await
}

/// The routes a role opens rather than a topic's grant: whether it takes the admin role (else
/// monitor or admin), and what the caller was refused, for the error.
fn role_route(route: &str) -> Option<(bool, &'static str)> {
    Some(match route {
        "/metrics" => (false, "read metrics"),
        "/history" => (false, "read the broker's history"),
        "/node" => (false, "read the node's resources and settings"),
        "/cluster" => (false, "read the cluster's nodes and partitions"),
        "/cluster/nodes" => (true, "admit nodes to the cluster"),
        "/cluster/nodes/{node}" => (true, "remove nodes from the cluster"),
        "/connections" => (false, "list connections"),
        "/connections/{id}" => (true, "close connections"),
        _ => return None,
    })
}

/// The middleware of every routed request (see the module doc).
pub(crate) async fn guard(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if from_script(request.headers()) {
        challenge_for_script(checked(state, request, next).await)
    } else {
        checked(state, request, next).await
    }
}

async fn checked(state: AppState, mut request: Request, next: Next) -> Response {
    let path = request.uri().path().to_owned();
    if let Err(error) = check_host(&state, request.headers()) {
        return error.into_response();
    }
    if let Err(error) = check_origin(request.method(), &path, request.headers()) {
        return error.into_response();
    }
    if PUBLIC_PATHS.contains(&path.as_str()) {
        return next.run(request).await;
    }
    let peer = request.extensions().get::<Peer>().map(|p| p.0);
    let certificate = request.extensions().get::<CertificateUser>();
    let identity = match identify(
        &state,
        peer,
        certificate,
        request.method(),
        request.headers(),
    )
    .await
    {
        Ok(identity) => identity,
        Err(response) => return response,
    };
    let caller = Caller::new(Access::new(state.broker.auth().clone(), identity));
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned());
    let allowed = match (route.as_deref(), route.as_deref().and_then(role_route)) {
        (_, Some((admin, what))) => caller
            .with(|access| match admin {
                true => access.check_admin(what),
                false => access.check_monitor(what),
            })
            .map_err(ApiError::from),
        (Some(route), None) => match (route_action(request.method(), route), path_topic(&path)) {
            (Some(action), Some(topic)) => caller.check(action, &topic),
            _ => caller
                .with(|access| access.refresh())
                .map_err(ApiError::from),
        },
        (None, None) => Ok(()),
    };
    if let Err(error) = allowed {
        return error.into_response();
    }
    // A request that may change something runs in a span naming who acted, so that the
    // broker's line about each change ("user added", "topic deleted", ...) says it.
    let span = match *request.method() {
        Method::GET | Method::HEAD | Method::OPTIONS => tracing::Span::none(),
        _ => {
            let actor = caller.with(|access| access.identity().describe());
            tracing::info_span!("admin", %actor, via = "http", method = %request.method(), path = %path)
        }
    };
    request.extensions_mut().insert(caller);
    next.run(request).instrument(span).await
}

/// The publish route, served past the router: the same checks, with the connection's caller
/// kept between requests that send the same `Authorization`, so that a keep-alive publisher
/// pays for its credentials once (a publish then costs one map lookup more).
pub(crate) fn gate_publish<B: crate::publish::RequestBody + 'static>(
    connection: Arc<Connection>,
    request: http::Request<B>,
) -> impl std::future::Future<Output = http::Response<crate::publish::ReplyBody>> + Send {
    let state = &connection.state;
    let refused = |error: ApiError| {
        Either::Right(Either::Left(std::future::ready(
            error.into_response().map(http_body_util::Either::Right),
        )))
    };
    if let Err(error) = check_host(state, request.headers()) {
        return refused(error);
    }
    if let Err(error) = check_origin(request.method(), request.uri().path(), request.headers()) {
        return refused(error);
    }
    let topic = path_topic(request.uri().path()).unwrap_or_default();
    let header = request.headers().get(header::AUTHORIZATION).cloned();
    // A session is checked on every request (its CSRF token, its expiry), never cached: a
    // cached caller is keyed by `Authorization` alone.
    let cacheable = header.is_some() || crate::session_store::cookie(request.headers()).is_none();
    if cacheable {
        let mut cached = connection.caller.lock();
        if let Some((sent, access)) = cached.as_mut() {
            if *sent == header {
                match access.check(Action::Publish, &topic) {
                    Ok(()) => {
                        drop(cached);
                        return Either::Left(crate::publish::serve(connection, request));
                    }
                    // Refreshed and refused: the credentials are checked again below.
                    Err(BrokerError::AuthenticationFailed(_)) => *cached = None,
                    Err(error) => return refused(error.into()),
                }
            }
        }
    }
    Either::Right(Either::Right(Box::pin(async move {
        let peer = request.extensions().get::<Peer>().map(|p| p.0);
        let certificate = request.extensions().get::<CertificateUser>();
        let identity = match identify(
            &connection.state,
            peer,
            certificate,
            request.method(),
            request.headers(),
        )
        .await
        {
            Ok(identity) => identity,
            Err(response) if from_script(request.headers()) => {
                return challenge_for_script(response).map(http_body_util::Either::Right)
            }
            Err(response) => return response.map(http_body_util::Either::Right),
        };
        let mut access = Access::new(connection.state.broker.auth().clone(), identity);
        if let Err(error) = access.check(Action::Publish, &topic) {
            return ApiError::from(error)
                .into_response()
                .map(http_body_util::Either::Right);
        }
        if cacheable {
            *connection.caller.lock() = Some((header, access));
        }
        crate::publish::serve(connection, request).await
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn authorization_headers_parse_or_say_what_is_wrong() {
        let basic = base64::engine::general_purpose::STANDARD.encode("alice:pa:ss");
        let c = credentials(&headers(&[("authorization", &format!("Basic {basic}"))])).unwrap();
        assert_eq!((c.user.as_str(), c.secret.as_str()), ("alice", "pa:ss"));
        let c = credentials(&headers(&[("authorization", "Bearer fmq_abc")])).unwrap();
        assert_eq!((c.user.as_str(), c.secret.as_str()), ("", "fmq_abc"));
        for bad in ["Basic !!!", "Bearer", "Digest x", "Basic YWxpY2U="] {
            let error = credentials(&headers(&[("authorization", bad)]))
                .err()
                .unwrap();
            assert!(error.contains("Authorization"), "{bad}: {error}");
            assert!(!error.contains("YWxp"), "{error}");
        }
    }

    #[test]
    fn hosts_other_than_ours_are_refused() {
        let allowed = vec!["broker.internal".to_owned()];
        for ok in [
            "127.0.0.1:7080",
            "localhost:7080",
            "[::1]:7080",
            "broker.internal",
            "10.1.2.3",
        ] {
            host_allowed(&headers(&[("host", ok)]), &allowed).unwrap();
        }
        let error = host_allowed(&headers(&[("host", "evil.example:7080")]), &allowed).unwrap_err();
        assert!(error.message.contains("evil.example"), "{}", error.message);
    }

    #[test]
    fn cross_site_writes_and_streams_are_refused() {
        let h = |origin: &str| headers(&[("host", "127.0.0.1:7080"), ("origin", origin)]);
        check_origin(
            &Method::POST,
            "/topics/t/messages",
            &h("http://127.0.0.1:7080"),
        )
        .unwrap();
        assert!(check_origin(
            &Method::POST,
            "/topics/t/messages",
            &h("https://evil.example")
        )
        .is_err());
        assert!(check_origin(&Method::POST, "/topics/t/messages", &h("null")).is_err());
        assert!(check_origin(
            &Method::GET,
            "/topics/t/subscriptions/s/stream",
            &h("https://evil.example")
        )
        .is_err());
        check_origin(&Method::GET, "/topics", &h("https://evil.example")).unwrap();
        check_origin(
            &Method::POST,
            "/topics/t/messages",
            &headers(&[("host", "x")]),
        )
        .unwrap();
    }

    #[test]
    fn routes_map_to_actions_and_topics_decode() {
        assert_eq!(
            route_action(&Method::POST, "/topics/{topic}/messages"),
            Some(Action::Publish)
        );
        assert_eq!(
            route_action(
                &Method::GET,
                "/topics/{topic}/subscriptions/{subscription}/ws"
            ),
            Some(Action::Consume)
        );
        assert_eq!(route_action(&Method::GET, "/topics"), None);
        assert_eq!(
            path_topic("/topics/orders.eu/messages").unwrap(),
            "orders.eu"
        );
        assert_eq!(
            path_topic("/topics/orders%2Eeu/stats").unwrap(),
            "orders.eu"
        );
        assert_eq!(path_topic("/topics/bad%2/x"), None);
    }
}
