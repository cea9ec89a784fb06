//! A TCP proxy on loopback in front of the S3 server, to force a store's races and outages open
//! for real (OS-2): it forwards each HTTP request and its answer as they are, or — as the test
//! says, for requests of one method — holds the answer until released, drops the request with
//! its connection (a store that cannot be reached), or forwards the request and then cuts the
//! connection before the answer (a call whose answer is lost). It counts each request it did
//! that to, so a test can assert that its window was hit.
//!
//! With a rate set ([`Proxy::limit_rate`]) it is also a store that throttles, as S3 does above a
//! prefix's request rate: a request beyond that rate (a token bucket refilled at the rate, a
//! tenth of a second's worth deep) is answered `503 Slow Down` with S3's `SlowDown` error body by
//! the proxy itself, its body read and never forwarded. Each request is read whole, however its
//! bytes arrive — its head up to the blank line, then the body the head announces — so that an
//! action is taken for exactly one request and the next starts where it ends. The benchmark uses
//! this same file (`bench/src/main.rs` includes it).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};

/// What the proxy does to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Forward,
    /// The request goes on; its answer waits until [`Proxy::release`].
    Hold,
    /// The connection is closed before the request reaches the server.
    Drop,
    /// The request reaches the server; the connection is closed before its answer comes back.
    Cut,
    /// Answered `503 SlowDown` by the proxy (the rate is exceeded); never forwarded.
    SlowDown,
}

#[derive(Debug, Clone, Copy)]
struct Rule {
    /// The request's method (`"HEAD"`), or every request when `None`.
    method: Option<&'static str>,
    action: Action,
    /// Requests of that method forwarded first.
    skip: usize,
    /// How many more times; then the proxy forwards again.
    times: usize,
}

#[derive(Default)]
struct Shared {
    rule: Mutex<Option<Rule>>,
    /// Requests held, dropped or cut.
    hit: Mutex<usize>,
    hit_notify: Notify,
    rate: Mutex<Option<Bucket>>,
    /// Requests answered `503 SlowDown`.
    throttled: AtomicUsize,
    /// Requests forwarded to the server.
    forwarded: AtomicUsize,
}

/// A token bucket: requests forwarded at `per_second` at the most, in bursts of a tenth of a
/// second's worth.
struct Bucket {
    per_second: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn take(&mut self) -> bool {
        let now = Instant::now();
        let depth = (self.per_second / 10.0).max(1.0);
        let refill = now.duration_since(self.at).as_secs_f64() * self.per_second;
        self.tokens = (self.tokens + refill).min(depth);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The proxy; its listener and connections end with the test's runtime.
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    /// `true` while held answers wait.
    holding: watch::Sender<bool>,
}

impl Proxy {
    /// A proxy on a free loopback port in front of `upstream` (`http://127.0.0.1:PORT`).
    pub async fn start(upstream: &str) -> Self {
        let upstream = upstream
            .strip_prefix("http://")
            .expect("an http:// endpoint")
            .trim_end_matches('/')
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared::default());
        let (holding, _) = watch::channel(false);
        let proxy = Self {
            port,
            shared: shared.clone(),
            holding,
        };
        let held = proxy.holding.subscribe();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (shared, upstream, held) = (shared.clone(), upstream.clone(), held.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        connection(client, server, &shared, held).await;
                    }
                });
            }
        });
        proxy
    }

    /// The endpoint to reach the server through the proxy.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// From now on, `action` for the next `times` requests of `method` (every request when
    /// `None`); the others are forwarded.
    pub fn rule(&self, method: Option<&'static str>, action: Action, times: usize) {
        self.rule_after(0, method, action, times);
    }

    /// [`rule`](Self::rule), after the next `skip` requests of `method` are forwarded.
    pub fn rule_after(
        &self,
        skip: usize,
        method: Option<&'static str>,
        action: Action,
        times: usize,
    ) {
        if action == Action::Hold {
            self.holding.send_replace(true);
        }
        *self.shared.rule.lock().unwrap() = Some(Rule {
            method,
            action,
            skip,
            times,
        });
    }

    /// Forwards every request again and lets the held answers go.
    pub fn release(&self) {
        *self.shared.rule.lock().unwrap() = None;
        self.holding.send_replace(false);
    }

    /// From now on, at most `per_second` requests a second forwarded; the others answered
    /// `503 SlowDown`. `None`: every request forwarded again.
    pub fn limit_rate(&self, per_second: Option<u32>) {
        *self.shared.rate.lock().unwrap() = per_second.map(|per_second| Bucket {
            per_second: f64::from(per_second),
            tokens: 0.0,
            at: Instant::now(),
        });
    }

    /// Requests answered `503 SlowDown` so far.
    pub fn throttled(&self) -> usize {
        self.shared.throttled.load(Ordering::Relaxed)
    }

    /// Requests forwarded to the server so far.
    pub fn forwarded(&self) -> usize {
        self.shared.forwarded.load(Ordering::Relaxed)
    }

    /// Requests dropped or cut, and answers held, so far.
    pub fn hit(&self) -> usize {
        *self.shared.hit.lock().unwrap()
    }

    /// Waits until at least `n` requests were dropped or cut, or their answers held.
    pub async fn hit_at_least(&self, n: usize) {
        loop {
            let notified = self.shared.hit_notify.notified();
            if self.hit() >= n {
                return;
            }
            notified.await;
        }
    }
}

/// The longest request head the proxy reads; a longer one ends the connection.
const MAX_HEAD: usize = 64 * 1024;

/// The action for a request of `method`: a rule's, or else forwarded within the rate.
fn action_for(shared: &Shared, method: &str) -> Action {
    let mut rule = shared.rule.lock().unwrap();
    let Some(r) = rule.as_mut() else {
        drop(rule);
        return shared.paced();
    };
    if r.times == 0 || r.method.is_some_and(|m| m != method) {
        drop(rule);
        return shared.paced();
    }
    if r.skip > 0 {
        r.skip -= 1;
        drop(rule);
        return shared.paced();
    }
    r.times -= 1;
    let action = r.action;
    drop(rule);
    // A held request counts once its answer is held (the server has answered it).
    if matches!(action, Action::Drop | Action::Cut) {
        shared.hit();
    }
    action
}

impl Shared {
    /// A request no rule is about: forwarded, unless it is beyond the rate.
    fn paced(&self) -> Action {
        let allowed = match self.rate.lock().unwrap().as_mut() {
            Some(bucket) => bucket.take(),
            None => true,
        };
        if allowed {
            self.forwarded.fetch_add(1, Ordering::Relaxed);
            Action::Forward
        } else {
            self.throttled.fetch_add(1, Ordering::Relaxed);
            Action::SlowDown
        }
    }

    fn hit(&self) {
        *self.hit.lock().unwrap() += 1;
        self.hit_notify.notify_waiters();
    }
}

/// The request whose answer the server sends now, and what that answer is to meet.
#[derive(Clone, Copy)]
struct Current {
    request: u64,
    action: Action,
}

/// One client connection and its own connection to the server. The client's bytes are read a
/// request at a time — its head whole, up to the blank line, then exactly the body its head
/// announces (`Content-Length`, or chunked to the last chunk) — and each request is forwarded,
/// answered here, or dropped whole; the server's bytes go back as they come, as the request
/// they answer says. The client sends its next request only once it has its answer (HTTP/1.1
/// without pipelining, as `object_store`'s client and s3s-fs speak; and it sends a body with its
/// head, never waiting for `100 Continue`), so the answer the server sends is the last
/// forwarded request's.
async fn connection(
    mut client: TcpStream,
    mut server: TcpStream,
    shared: &Shared,
    held: watch::Receiver<bool>,
) {
    let (client_read, client_write) = client.split();
    let (server_read, server_write) = server.split();
    let to_client = tokio::sync::Mutex::new(client_write);
    let current = Mutex::new(Current {
        request: 0,
        action: Action::Forward,
    });
    tokio::select! {
        () = requests(client_read, server_write, &to_client, &current, shared) => {}
        () = answers(server_read, &to_client, &current, shared, held) => {}
    }
}

/// The client's requests, one after another, each met with its action; returns when the
/// connection is to end.
async fn requests(
    client: impl AsyncRead + Unpin,
    mut server: impl AsyncWrite + Unpin,
    to_client: &tokio::sync::Mutex<impl AsyncWrite + Unpin>,
    current: &Mutex<Current>,
    shared: &Shared,
) {
    let mut client = Incoming {
        stream: client,
        buffer: Vec::new(),
    };
    for request in 1.. {
        let Some(head) = client.head().await else {
            return;
        };
        let Some(request_head) = RequestHead::parse(&head) else {
            return;
        };
        match action_for(shared, &request_head.method) {
            Action::Drop => return,
            Action::SlowDown => {
                let dropped = tokio::io::sink();
                if client.body(request_head.body, dropped).await.is_none() {
                    return;
                }
                let answer = slow_down(&request_head.method);
                if to_client.lock().await.write_all(&answer).await.is_err() {
                    return;
                }
            }
            action => {
                *current.lock().unwrap() = Current { request, action };
                if server.write_all(&head).await.is_err()
                    || client.body(request_head.body, &mut server).await.is_none()
                {
                    return;
                }
            }
        }
    }
}

/// The server's answers, back to the client as they come, as the request they answer says:
/// held until released, or cut at their first bytes.
async fn answers(
    mut server: impl AsyncRead + Unpin,
    to_client: &tokio::sync::Mutex<impl AsyncWrite + Unpin>,
    current: &Mutex<Current>,
    shared: &Shared,
    mut held: watch::Receiver<bool>,
) {
    // The request whose answer was counted as held.
    let mut counted = 0;
    let mut down = [0u8; 16 * 1024];
    loop {
        let Ok(n @ 1..) = server.read(&mut down).await else {
            return;
        };
        let Current { request, action } = *current.lock().unwrap();
        match action {
            Action::Cut | Action::Drop | Action::SlowDown => return,
            Action::Hold => {
                if counted != request {
                    counted = request;
                    shared.hit();
                }
                let _ = held.wait_for(|holding| !holding).await;
            }
            Action::Forward => {}
        }
        if to_client.lock().await.write_all(&down[..n]).await.is_err() {
            return;
        }
    }
}

/// How a request's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    /// `Content-Length` bytes (none without the header).
    Length(u64),
    /// `Transfer-Encoding: chunked`: chunks up to the last, empty one, and its trailers.
    Chunked,
}

/// What the proxy reads of a request's head.
#[derive(Debug, PartialEq, Eq)]
struct RequestHead {
    method: String,
    body: Body,
}

impl RequestHead {
    /// The head of a request, its blank line included; `None` when it is not one.
    fn parse(head: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(head).ok()?;
        let mut lines = text.split("\r\n");
        let mut request_line = lines.next()?.split(' ');
        let method = request_line.next().filter(|m| !m.is_empty())?.to_owned();
        request_line.next()?;
        request_line.next().filter(|v| v.starts_with("HTTP/"))?;
        let (mut length, mut chunked) = (None, false);
        for line in lines.filter(|line| !line.is_empty()) {
            let (name, value) = line.split_once(':')?;
            let (name, value) = (name.trim(), value.trim());
            if name.eq_ignore_ascii_case("content-length") {
                length = Some(value.parse::<u64>().ok()?);
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value
                    .rsplit(',')
                    .next()
                    .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
            }
        }
        let body = if chunked {
            Body::Chunked
        } else {
            Body::Length(length.unwrap_or(0))
        };
        Some(Self { method, body })
    }
}

/// The client's side of a connection: what it sent, read as far as needed.
struct Incoming<R> {
    stream: R,
    /// Bytes read and not yet passed on.
    buffer: Vec<u8>,
}

impl<R: AsyncRead + Unpin> Incoming<R> {
    /// More bytes read into the buffer; `false` once the client has closed or failed.
    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 16 * 1024];
        match self.stream.read(&mut chunk).await {
            Ok(n @ 1..) => {
                self.buffer.extend_from_slice(&chunk[..n]);
                true
            }
            _ => false,
        }
    }

    /// The bytes up to and with the first `end`; `None` when the client closes first or sends
    /// more than `limit` bytes without it.
    async fn until(&mut self, end: &[u8], limit: usize) -> Option<Vec<u8>> {
        let mut from = 0;
        loop {
            if let Some(at) = self.buffer[from..]
                .windows(end.len())
                .position(|window| window == end)
            {
                return Some(self.buffer.drain(..from + at + end.len()).collect());
            }
            from = self.buffer.len().saturating_sub(end.len() - 1);
            if self.buffer.len() > limit || !self.fill().await {
                return None;
            }
        }
    }

    /// The next request's head, up to and with its blank line.
    async fn head(&mut self) -> Option<Vec<u8>> {
        self.until(b"\r\n\r\n", MAX_HEAD).await
    }

    /// Exactly `n` bytes passed to `sink`.
    async fn exactly(&mut self, mut n: u64, sink: &mut (impl AsyncWrite + Unpin)) -> Option<()> {
        while n > 0 {
            if self.buffer.is_empty() && !self.fill().await {
                return None;
            }
            let take = self
                .buffer
                .len()
                .min(usize::try_from(n).unwrap_or(usize::MAX));
            sink.write_all(&self.buffer[..take]).await.ok()?;
            self.buffer.drain(..take);
            n -= take as u64;
        }
        Some(())
    }

    /// The next line, passed to `sink`.
    async fn line(&mut self, sink: &mut (impl AsyncWrite + Unpin)) -> Option<Vec<u8>> {
        let line = self.until(b"\r\n", MAX_HEAD).await?;
        sink.write_all(&line).await.ok()?;
        Some(line)
    }

    /// The body `body` frames, passed to `sink` as it was sent (`tokio::io::sink()` drops it).
    async fn body(&mut self, body: Body, mut sink: impl AsyncWrite + Unpin) -> Option<()> {
        if let Body::Length(length) = body {
            return self.exactly(length, &mut sink).await;
        }
        // Chunks, each after the line giving its size in hex, up to the last one (size 0);
        // then the trailers, up to the blank line.
        loop {
            let line = self.line(&mut sink).await?;
            let line = std::str::from_utf8(&line).ok()?;
            let digits = line.trim_end().split(';').next()?.trim();
            let size = u64::from_str_radix(digits, 16).ok()?;
            if size == 0 {
                break;
            }
            // The chunk, and the line end after it.
            self.exactly(size + 2, &mut sink).await?;
        }
        while self.line(&mut sink).await? != b"\r\n" {}
        Some(())
    }
}

/// S3's answer to a request beyond the rate: `503 Slow Down` with its XML error (no body after
/// a HEAD's head).
fn slow_down(method: &str) -> Vec<u8> {
    let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>\
                <Message>Please reduce your request rate.</Message>\
                <RequestId>sexton-test-proxy</RequestId></Error>";
    let mut answer = format!(
        "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n\
         Content-Length: {}\r\nx-amz-request-id: sexton-test-proxy\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if method != "HEAD" {
        answer.extend_from_slice(body.as_bytes());
    }
    answer
}
