//! The S3 client's connector: every HTTP request through a root's [`Window`], on a task of its
//! own, a throttling answer retried there (see the module above for why each is so).

use std::hash::{BuildHasher as _, RandomState};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use object_store::ClientOptions;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse, HttpService,
    ReqwestConnector,
};
use reqwest::StatusCode;
use tokio_util::task::AbortOnDropHandle;

use super::Window;

/// The longest wait before a throttled request is sent again, however slow the store's rounds.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Whether an answer says the store is throttling: `503` (S3's `SlowDown`), `429`, or the
/// connection reset or closed before the answer came.
fn throttling(answer: &Result<HttpResponse, HttpError>) -> bool {
    match answer {
        Ok(response) => matches!(
            response.status(),
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS
        ),
        Err(err) => matches!(
            err.kind(),
            HttpErrorKind::Request | HttpErrorKind::Interrupted
        ),
    }
}

/// A wait drawn at random up to two rounds, at most [`MAX_BACKOFF`].
fn backoff(round: Duration) -> Duration {
    let ceiling = round.saturating_mul(2).min(MAX_BACKOFF);
    let draw = RandomState::new().hash_one(round);
    ceiling.mul_f64((draw >> 11) as f64 / (1u64 << 53) as f64)
}

/// The S3 client's connector: `object_store`'s own reqwest client, each request through the
/// window.
#[derive(Debug)]
pub(in crate::files::object) struct Paced {
    pub(in crate::files::object) window: Arc<Window>,
    /// `object_store`'s retry timeout: a throttled request is retried here until it passes.
    pub(in crate::files::object) retry_timeout: Duration,
}

impl HttpConnector for Paced {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(PacedService {
            inner,
            window: self.window.clone(),
            retry_timeout: self.retry_timeout,
        }))
    }
}

#[derive(Debug)]
struct PacedService {
    inner: HttpClient,
    window: Arc<Window>,
    retry_timeout: Duration,
}

#[async_trait]
impl HttpService for PacedService {
    /// The request sent on a task of its own, which gives its place back as soon as the store
    /// answers: a caller that does not poll its request for a while (a walk whose signature reads
    /// wait in its read-ahead while it deletes a batch) must not keep places the window has shrunk
    /// to, or the calls it waits on would never get one. Dropped, the call ends its task.
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let sent = paced(
            self.inner.clone(),
            self.window.clone(),
            self.retry_timeout,
            request,
        );
        match AbortOnDropHandle::new(tokio::spawn(sent)).await {
            Ok(answer) => answer,
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(err) => Err(HttpError::new(HttpErrorKind::Interrupted, err)),
        }
    }
}

/// `request` through `window`: a place taken for each try, and a throttling answer retried
/// after a backoff (its place kept while it waits) until `retry_timeout` has passed.
async fn paced(
    inner: HttpClient,
    window: Arc<Window>,
    retry_timeout: Duration,
    request: HttpRequest,
) -> Result<HttpResponse, HttpError> {
    let started = Instant::now();
    loop {
        let place = window.enter().await;
        let answer = match inner.execute(request.clone()).await {
            Ok(page) if listing(&request) && page.status().is_success() => read_whole(page).await,
            answer => answer,
        };
        let throttled = throttling(&answer);
        place.answered(throttled, Instant::now());
        let status = answer.as_ref().map(HttpResponse::status);
        let retry = matches!(
            status,
            Ok(StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS)
        );
        if !retry || started.elapsed() >= retry_timeout {
            return answer;
        }
        // The answer's few bytes read, so that its connection serves the next request.
        if let Ok(response) = answer {
            let _ = response.into_body().bytes().await;
        }
        tokio::time::sleep(backoff(window.round())).await;
        drop(place);
    }
}

/// Whether `request` asks for a page of a listing (`ListObjectsV2`).
fn listing(request: &HttpRequest) -> bool {
    request
        .uri()
        .query()
        .is_some_and(|query| query.split('&').any(|pair| pair == "list-type=2"))
}

/// `page` with its body read whole, on the request's own task: a listing's caller may take its
/// pages' objects one range at a time (see ranges.rs), and a page answered but left unread
/// longer than the client's timeout fails the listing.
async fn read_whole(page: HttpResponse) -> Result<HttpResponse, HttpError> {
    let (head, body) = page.into_parts();
    let body = body.bytes().await?;
    Ok(HttpResponse::from_parts(head, body.into()))
}

#[cfg(test)]
mod tests {
    use futures::FutureExt as _;
    use object_store::client::{HttpRequestBody, HttpResponseBody};

    use super::*;

    /// A store that answers each request with `200 OK` once let (a permit of `go` each).
    #[derive(Debug)]
    struct Answers {
        go: Arc<tokio::sync::Semaphore>,
    }

    #[async_trait]
    impl HttpService for Answers {
        async fn call(&self, _request: HttpRequest) -> Result<HttpResponse, HttpError> {
            self.go.acquire().await.unwrap().forget();
            Ok(HttpResponse::new(HttpResponseBody::from(String::new())))
        }
    }

    /// Lets the runtime's other tasks run until they wait again.
    async fn settle() {
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn pf7_an_answered_request_gives_its_place_back_before_its_caller_looks_at_it() {
        let window = Arc::new(Window::new(1));
        let go = Arc::new(tokio::sync::Semaphore::new(0));
        let service = PacedService {
            inner: HttpClient::new(Answers { go: go.clone() }),
            window: window.clone(),
            retry_timeout: Duration::from_secs(180),
        };
        let request = || HttpRequest::new(HttpRequestBody::from(Vec::new()));
        let in_flight = || window.state().in_flight;

        // A request sent, then not looked at: a read-ahead the walk does not poll while it
        // deletes a batch.
        let mut read_ahead = Box::pin(service.call(request()));
        assert!(read_ahead.as_mut().now_or_never().is_none());
        settle().await;
        assert_eq!(in_flight(), 1);
        // The store answers it: its place is free though nobody polled it, so the delete's
        // request gets through a window of one.
        go.add_permits(1);
        settle().await;
        assert_eq!(in_flight(), 0);
        go.add_permits(1);
        let delete = service.call(request()).await.unwrap();
        assert_eq!(delete.status(), StatusCode::OK);
        assert_eq!(read_ahead.await.unwrap().status(), StatusCode::OK);

        // A call given up gives its place back, its request ended.
        let mut given_up = Box::pin(service.call(request()));
        assert!(given_up.as_mut().now_or_never().is_none());
        settle().await;
        assert_eq!(in_flight(), 1);
        drop(given_up);
        settle().await;
        assert_eq!(in_flight(), 0);
        assert_eq!(window.seen().throttled, 0);
    }

    #[test]
    fn pf7_backoff_stays_under_two_rounds_and_its_ceiling() {
        for ms in [1, 10, 45, 300, 999, 5000] {
            let round = Duration::from_millis(ms);
            let wait = backoff(round);
            assert!(
                wait <= round * 2 && wait <= MAX_BACKOFF,
                "{wait:?} after {round:?}"
            );
        }
    }
}
