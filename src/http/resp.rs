//! The response and request helpers every route shares: JSON answers, precise refusals, body
//! limits, query strings. The ground floor of `http/`: it imports no route.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Incoming};
use hyper::header::{HeaderValue, ALLOW, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use serde::Deserialize;
use serde_json::json;

use super::HttpApp;

pub(super) type Resp = Response<Full<Bytes>>;

pub(super) fn json_resp(status: StatusCode, body: serde_json::Value) -> Resp {
    json_text_resp(status, body.to_string())
}

/// A response whose JSON text the caller wrote itself (the `/next` hot path, where building a
/// `serde_json::Value` map per request showed in the profile).
pub(super) fn json_text_resp(status: StatusCode, body: String) -> Resp {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

pub(super) fn error(status: StatusCode, code: &str, detail: impl Into<String>) -> Resp {
    json_resp(status, json!({ "error": code, "detail": detail.into() }))
}

pub(super) fn method_not_allowed(allow: &'static str) -> Resp {
    let mut r = error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("allowed: {allow}"),
    );
    r.headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    r
}

/// Asks hyper to close the connection after this response (its request was not fully read, or
/// the client was too slow to keep).
pub(super) fn closing(mut r: Resp) -> Resp {
    r.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Reads a whole body of at most `limit` bytes: 413 past it, 400 if the stream breaks.
pub(super) async fn collect_limited(body: Incoming, limit: usize) -> Result<Bytes, Resp> {
    match Limited::new(body, limit).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!("body over {limit} bytes"),
            ))
        }
        Err(e) => Err(error(StatusCode::BAD_REQUEST, "bad_body", e.to_string())),
    }
}

/// [`collect_limited`] within the body-read bound: a client that trickles its body, or sends
/// fewer bytes than its Content-Length, gets 408 and the connection closes.
pub(super) async fn collect_client_body(app: &HttpApp, body: Incoming) -> Result<Bytes, Resp> {
    let limit = app.limits.max_body_bytes;
    let bound = app.limits.body_read_timeout();
    match tokio::time::timeout(bound, collect_limited(body, limit)).await {
        // A refused body was not read to its end: the connection cannot carry another request.
        Ok(r) => r.map_err(closing),
        Err(_) => Err(closing(error(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!("request body not received within {} ms", bound.as_millis()),
        ))),
    }
}

/// Reads a small body: 413 past the limit, 408 if it is slower than the body bound, 415 unless
/// JSON, 400 unless it parses. An empty body is `T::default()`.
pub(super) async fn read_json<T: for<'de> Deserialize<'de> + Default>(
    app: &HttpApp,
    req: Request<Incoming>,
) -> Result<T, Resp> {
    // Nothing to read (no body, or `Content-Length: 0`): no body timer, no collecting.
    if req.body().is_end_stream() {
        return Ok(T::default());
    }
    let limit = app.limits.max_body_bytes;
    if let Some(len) = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > limit as u64 {
            return Err(closing(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!("body over {limit} bytes"),
            )));
        }
    }
    let content_type = req
        .headers()
        .get(CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("?").to_owned());
    let body = collect_client_body(app, req.into_body()).await?;
    if body.is_empty() {
        return Ok(T::default());
    }
    match content_type.as_deref() {
        Some(ct)
            if ct
                .split(';')
                .next()
                .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json")) => {}
        other => {
            return Err(error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!("expected application/json, got {}", other.unwrap_or("none")),
            ));
        }
    }
    serde_json::from_slice(&body)
        .map_err(|e| error(StatusCode::BAD_REQUEST, "malformed_json", e.to_string()))
}

/// Parses `key=value` pairs of the query; unknown keys are an error (a typo must not be ignored).
// The error is the whole 400 response, made once per bad request: boxing it would buy nothing.
#[allow(clippy::result_large_err)]
pub(super) fn query_pairs<'a>(
    req: &'a Request<Incoming>,
    allowed: &[&str],
) -> Result<Vec<(&'a str, &'a str)>, Resp> {
    let mut out = Vec::new();
    for pair in req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if !allowed.contains(&k) {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "unknown_parameter",
                k.to_owned(),
            ));
        }
        out.push((k, v));
    }
    Ok(out)
}
