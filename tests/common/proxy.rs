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
//! the proxy itself, its body read and never forwarded. The benchmark uses this same file
//! (`bench/src/main.rs` includes it).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
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

const METHODS: [&str; 5] = ["GET", "HEAD", "POST", "PUT", "DELETE"];

/// The action for a chunk the client sent: a new request's when the chunk starts one.
fn action_for(shared: &Shared, chunk: &[u8]) -> Option<Action> {
    let method = METHODS
        .into_iter()
        .find(|method| chunk.starts_with(format!("{method} ").as_bytes()))?;
    let mut rule = shared.rule.lock().unwrap();
    let Some(r) = rule.as_mut() else {
        drop(rule);
        return Some(shared.paced());
    };
    if r.times == 0 || r.method.is_some_and(|m| m != method) {
        drop(rule);
        return Some(shared.paced());
    }
    if r.skip > 0 {
        r.skip -= 1;
        drop(rule);
        return Some(shared.paced());
    }
    r.times -= 1;
    let action = r.action;
    drop(rule);
    // A held request counts once its answer is held (the server has answered it).
    if matches!(action, Action::Drop | Action::Cut) {
        shared.hit();
    }
    Some(action)
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

async fn connection(
    mut client: TcpStream,
    mut server: TcpStream,
    shared: &Shared,
    mut held: watch::Receiver<bool>,
) {
    let (mut client_read, mut client_write) = client.split();
    let (mut server_read, mut server_write) = server.split();
    // What the current request's answer is to meet.
    let mut answer = Action::Forward;
    // Whether some of that answer came back already.
    let mut answered = false;
    // Bytes of a throttled request's body still to be read and dropped.
    let mut swallow = 0usize;
    let mut up = [0u8; 16 * 1024];
    let mut down = [0u8; 16 * 1024];
    loop {
        tokio::select! {
            read = client_read.read(&mut up) => {
                let Ok(n @ 1..) = read else { return };
                if swallow > 0 {
                    swallow = swallow.saturating_sub(n);
                    continue;
                }
                if let Some(action) = action_for(shared, &up[..n]) {
                    answer = action;
                    answered = false;
                }
                match answer {
                    Action::Drop => return,
                    Action::SlowDown => {
                        swallow = body_left(&up[..n]);
                        answer = Action::Forward;
                        if client_write.write_all(&slow_down(&up[..n])).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    _ => {}
                }
                if server_write.write_all(&up[..n]).await.is_err() {
                    return;
                }
            }
            read = server_read.read(&mut down) => {
                let Ok(n @ 1..) = read else { return };
                match answer {
                    Action::Cut | Action::Drop | Action::SlowDown => return,
                    Action::Hold => {
                        if !answered {
                            shared.hit();
                        }
                        let _ = held.wait_for(|holding| !holding).await;
                    }
                    Action::Forward => {}
                }
                answered = true;
                if client_write.write_all(&down[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Bytes of the request starting `chunk` that are not in it: its `Content-Length` less the body
/// bytes that came with its head.
fn body_left(chunk: &[u8]) -> usize {
    let Some(end) = chunk.windows(4).position(|w| w == b"\r\n\r\n") else {
        return 0;
    };
    let head = String::from_utf8_lossy(&chunk[..end]);
    let length = head
        .lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, value)| value.trim().parse::<usize>().ok())
        .unwrap_or(0);
    length.saturating_sub(chunk.len() - (end + 4))
}

/// S3's answer to a request beyond the rate: `503 Slow Down` with its XML error (no body after
/// a HEAD's head).
fn slow_down(request: &[u8]) -> Vec<u8> {
    let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>\
                <Message>Please reduce your request rate.</Message>\
                <RequestId>sexton-test-proxy</RequestId></Error>";
    let mut answer = format!(
        "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n\
         Content-Length: {}\r\nx-amz-request-id: sexton-test-proxy\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if !request.starts_with(b"HEAD ") {
        answer.extend_from_slice(body.as_bytes());
    }
    answer
}
