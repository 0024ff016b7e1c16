//! The web dashboard at `/ui/`: a single-page app built from the repository's `ui/` folder
//! (`ui/README.md`), its built files embedded in the binary, so that the broker serves it with
//! nothing beside it and `cargo build` needs no JavaScript toolchain.
//!
//! Every asset is embedded three times: as built, gzip and brotli (both made by the dashboard's
//! build), and the encoding the browser accepts is served as it is, never compressed per request.
//! Each answer carries a Content-Security-Policy that allows this origin only, so the page can
//! load nothing from anywhere else, and runs no inline script even if a name or a message body
//! slipped past its escaping.

use std::sync::OnceLock;

use axum::extract::Path;
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

use crate::{ApiError, AppState};

/// This origin only: no inline script or style, no plugin, no `<base>` rewrite, not framed.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; base-uri 'none'; \
     object-src 'none'; frame-ancestors 'none'; form-action 'self'";

/// One embedded file of the dashboard.
struct Asset {
    /// Below `/ui/`.
    path: &'static str,
    content_type: &'static str,
    identity: &'static [u8],
    gzip: &'static [u8],
    brotli: &'static [u8],
}

macro_rules! asset {
    ($path:literal, $content_type:literal) => {
        Asset {
            path: $path,
            content_type: $content_type,
            identity: include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../ui/dist/",
                $path
            )),
            gzip: include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../ui/dist/",
                $path,
                ".gz"
            )),
            brotli: include_bytes!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../ui/dist/",
                $path,
                ".br"
            )),
        }
    };
}

/// The dashboard's build writes exactly these files (its build fails on any other, and a test
/// below compares the list with `ui/dist`), under fixed names: the ETag, not the name, tells a
/// browser that a file changed.
static ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("assets/app.js", "text/javascript; charset=utf-8"),
    asset!("assets/app.css", "text/css; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
];

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        // Relative asset paths in the page resolve against `/ui/`, not `/`.
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(|headers: HeaderMap| async move { serve("index.html", &headers) }))
        .route(
            "/ui/{*path}",
            get(|Path(path): Path<String>, headers: HeaderMap| async move {
                serve(&path, &headers)
            }),
        )
}

fn serve(path: &str, request: &HeaderMap) -> Response {
    let Some((index, asset)) = ASSETS.iter().enumerate().find(|(_, a)| a.path == path) else {
        return ApiError::not_found(format!("the dashboard has no file '{path}': open /ui/"))
            .into_response();
    };
    let etag = etags()[index].as_str();
    let mut response = if if_none_match(request, etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let accepted = request
            .get(header::ACCEPT_ENCODING)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let (encoding, body) = if accepts(accepted, "br") {
            (Some("br"), asset.brotli)
        } else if accepts(accepted, "gzip") {
            (Some("gzip"), asset.gzip)
        } else {
            (None, asset.identity)
        };
        let mut response = body.into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        );
        if let Some(encoding) = encoding {
            headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static(encoding));
        }
        response
    };
    let headers = response.headers_mut();
    headers.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    // Revalidated on every load (a 304 when unchanged), so an upgraded broker's page is never
    // mixed with a cached older script.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(value) = HeaderValue::from_str(etag) {
        headers.insert(header::ETAG, value);
    }
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// One strong ETag per asset: the FNV-1a hash of its bytes, computed once.
fn etags() -> &'static [String] {
    static ETAGS: OnceLock<Vec<String>> = OnceLock::new();
    ETAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|asset| {
                let hash = asset
                    .identity
                    .iter()
                    .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
                    });
                format!("\"{hash:016x}\"")
            })
            .collect()
    })
}

fn if_none_match(request: &HeaderMap, etag: &str) -> bool {
    request
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|tag| tag.trim().trim_start_matches("W/"))
        .any(|tag| tag == etag || tag == "*")
}

/// Whether an `Accept-Encoding` value accepts `coding` (named, or by `*`) with a weight above 0.
fn accepts(accept_encoding: &str, coding: &str) -> bool {
    let mut named = None;
    let mut any = None;
    for item in accept_encoding.split(',') {
        let mut parts = item.split(';');
        let name = parts.next().unwrap_or("").trim();
        let weight = parts
            .filter_map(|p| p.trim().strip_prefix("q="))
            .find_map(|q| q.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        if name.eq_ignore_ascii_case(coding) {
            named = Some(weight > 0.0);
        } else if name == "*" {
            any = Some(weight > 0.0);
        }
    }
    named.or(any).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_encoding_weights_are_honoured() {
        assert!(accepts("gzip, deflate, br, zstd", "br"));
        assert!(accepts("gzip, deflate, br, zstd", "gzip"));
        assert!(!accepts("gzip", "br"));
        assert!(!accepts("", "gzip"));
        assert!(!accepts("br;q=0, gzip", "br"));
        assert!(accepts("br;q=0.5", "br"));
        assert!(accepts("*", "br"));
        assert!(!accepts("*, br;q=0", "br"));
        assert!(accepts("GZIP", "gzip"));
    }

    #[test]
    fn embedded_assets_are_exactly_the_built_files() {
        let dist = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ui/dist");
        let mut built = Vec::new();
        let mut dirs = vec![dist.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                let name = path.strip_prefix(&dist).unwrap().to_str().unwrap();
                let name = name.replace('\\', "/");
                if !(name.ends_with(".gz") || name.ends_with(".br")) {
                    built.push(name);
                }
            }
        }
        built.sort();
        let mut embedded: Vec<String> = ASSETS.iter().map(|a| a.path.to_string()).collect();
        embedded.sort();
        assert_eq!(built, embedded, "ui/dist and the embedded list differ");
    }

    #[test]
    fn compressed_copies_are_smaller_and_not_empty() {
        for asset in ASSETS {
            assert!(!asset.identity.is_empty(), "{}", asset.path);
            assert!(
                !asset.gzip.is_empty() && !asset.brotli.is_empty(),
                "{}",
                asset.path
            );
            assert!(
                asset.brotli.len() <= asset.identity.len() + 64,
                "{}",
                asset.path
            );
        }
    }
}
