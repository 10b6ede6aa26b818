//! The one writer of local answers ([`drg_base::answer::Answer`]) and their response headers.
//!
//! Every local answer carries `Content-Type` and `Content-Length`, so keep-alive connections stay
//! open (Pingora closes a connection whose response has no length).

use bytes::Bytes;

use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE};
use http::StatusCode;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;

use drg_base::answer::{Answer, JSON};

/// The `X-Dataset-Version` header of `version` (a dozen ASCII characters, checked). Each
/// worker thread keeps a copy of the last one it made and hands out clones of that while the
/// table's version reads the same: a clone of the table's own bytes bumped a reference count
/// that every worker shares, on every answer, and the check ran on every answer too.
pub fn dataset_header(version: &drg_domain::table::DatasetVersion) -> HeaderValue {
    thread_local! {
        static LAST: std::cell::RefCell<Option<HeaderValue>> = const { std::cell::RefCell::new(None) };
    }
    let text = version.header_bytes();
    LAST.with_borrow_mut(|last| match last {
        Some(value) if value.as_bytes() == &text[..] => value.clone(),
        _ => {
            let value = HeaderValue::from_bytes(text)
                .unwrap_or_else(|_| HeaderValue::from_static("unknown"));
            *last = Some(value.clone());
            value
        }
    })
}

/// Builds the response header of an answer.
pub fn response_header(answer: &Answer) -> pingora::Result<ResponseHeader> {
    header_of(
        answer.status,
        answer.body.len(),
        answer.headers.iter().cloned(),
    )
}

/// The header map is filled directly and handed to Pingora as a case-less header: its
/// `append_header` would render each name to bytes and parse it back (two allocations per
/// custom name, on every answer), and our names are canonical already.
///
/// Never inlined: built inside `write`'s future, the header (a large struct) is copied once
/// more on its way to the heap, ~650 instructions of every answer (the instruction gate saw it
/// when an unrelated change tipped the inliner).
#[inline(never)]
fn header_of(
    status: StatusCode,
    body_len: usize,
    headers: impl ExactSizeIterator<Item = (HeaderName, HeaderValue)>,
) -> pingora::Result<ResponseHeader> {
    let too_many = |_| {
        pingora::Error::explain(
            pingora::ErrorType::InvalidHTTPHeader,
            "too many response headers",
        )
    };
    // Room for Pingora's `Date` and `Connection` too: a map filled to its capacity would be
    // grown and rehashed when Pingora adds them (every answer with the usual four headers did).
    let mut map = HeaderMap::with_capacity(2 + headers.len() + PINGORA_HEADERS);
    // 204 has no body, hence no content headers (RFC 9110 8.6).
    if status != StatusCode::NO_CONTENT {
        map.try_insert(CONTENT_TYPE, HeaderValue::from_static(JSON))
            .map_err(too_many)?;
        map.try_insert(CONTENT_LENGTH, content_length(body_len))
            .map_err(too_many)?;
    }
    for (name, value) in headers {
        // An answer naming its own type (the dashboard's files) replaces the JSON default.
        if name == CONTENT_TYPE {
            map.try_insert(name, value).map_err(too_many)?;
        } else {
            map.try_append(name, value).map_err(too_many)?;
        }
    }
    let (mut parts, ()) = http::Response::new(()).into_parts();
    parts.status = status;
    parts.headers = map;
    Ok(ResponseHeader::from(parts))
}

/// The headers Pingora adds to every HTTP/1 answer it writes (`Date`, `Connection`).
const PINGORA_HEADERS: usize = 2;

/// `Content-Length` values below this are made once (every lookup and error answer is shorter).
const CACHED_LENGTHS: usize = 4096;

/// The `Content-Length` value of `len`: a static one for the common sizes, since making a value
/// allocates and every answer needs one. Static rather than shared, so copying it touches no
/// reference count that the worker threads would contend for.
fn content_length(len: usize) -> HeaderValue {
    static LENGTHS: std::sync::OnceLock<Vec<HeaderValue>> = std::sync::OnceLock::new();
    if len >= CACHED_LENGTHS {
        return HeaderValue::from(len);
    }
    LENGTHS.get_or_init(|| {
        (0..CACHED_LENGTHS)
            // Leaked once, on purpose: 4096 short strings (~20 KB) for the process's life.
            .map(|n| HeaderValue::from_static(Box::leak(n.to_string().into_boxed_str())))
            .collect()
    })[len]
        .clone()
}

/// Writes an answer to the client: header, then the whole body.
pub async fn write(session: &mut Session, answer: Answer) -> pingora::Result<()> {
    let Answer {
        status,
        headers,
        body,
        ..
    } = answer;
    let header = header_of(status, body.len(), headers.into_iter())?;
    write_header_and_body(session, header, body).await
}

/// Writes a header and its whole body, then the end of the stream (one flush on HTTP/1: the
/// header sits in the connection's write buffer until the body joins it). No body (a 204, or an
/// empty one): the header ends the stream.
pub async fn write_header_and_body(
    session: &mut Session,
    header: ResponseHeader,
    body: Bytes,
) -> pingora::Result<()> {
    if body.is_empty() {
        return session.write_response_header(Box::new(header), true).await;
    }
    session
        .write_response_header(Box::new(header), false)
        .await?;
    session.write_response_body(Some(body), true).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_lists_the_answer_headers_after_the_content_headers() {
        let a = Answer::raw(StatusCode::OK, Bytes::from_static(b"{}"))
            .with_header(HeaderName::from_static("x-one"), HeaderValue::from(1))
            .with_header(HeaderName::from_static("x-one"), HeaderValue::from(2));
        let h = response_header(&a).unwrap();
        let names: Vec<_> = h
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.clone()))
            .collect();
        assert_eq!(
            names,
            [
                ("content-type", HeaderValue::from_static(JSON)),
                ("content-length", HeaderValue::from(2)),
                ("x-one", HeaderValue::from(1)),
                ("x-one", HeaderValue::from(2)),
            ]
        );
        assert!(!h.has_case());
        let none = response_header(&Answer::raw(StatusCode::NO_CONTENT, Bytes::new())).unwrap();
        assert!(none.headers.is_empty());
        assert_eq!(none.status, StatusCode::NO_CONTENT);
    }

    #[test]
    fn header_carries_type_and_length() {
        let a = Answer::raw(StatusCode::OK, Bytes::from_static(b"{}"));
        let h = response_header(&a).unwrap();
        assert_eq!(h.headers.get(CONTENT_LENGTH).unwrap(), "2");
        assert_eq!(h.headers.get(CONTENT_TYPE).unwrap(), JSON);
    }

    #[test]
    fn the_dataset_header_follows_the_table_it_is_asked_for() {
        use drg_domain::{DomainName, ListKind, Scores, TableBuilder};
        let table = |name: &str| {
            let mut b = TableBuilder::new();
            b.add(&DomainName::parse(name).unwrap(), ListKind::Disposable);
            b.build(Scores::default())
        };
        let first = table("a.example");
        let mut second = table("b.example");
        second.succeed(&first);
        // Alternately, as two tables in service across a reload are asked for.
        for t in [&first, &first, &second, &first, &second, &second] {
            assert_eq!(dataset_header(t.version()), t.version().as_str());
        }
    }

    #[test]
    fn content_lengths_are_their_numbers_either_side_of_the_cache() {
        for n in [
            0,
            1,
            9,
            10,
            187,
            CACHED_LENGTHS - 1,
            CACHED_LENGTHS,
            1 << 20,
        ] {
            assert_eq!(content_length(n), n.to_string().as_str(), "{n}");
        }
    }
}
