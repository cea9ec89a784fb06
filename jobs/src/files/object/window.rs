//! How many requests one object root has in flight at once (PF-7): a window of at most
//! `[storage] max_in_flight`, kept by congestion control as TCP keeps its own — every HTTP
//! request the S3 client sends waits for a place in the window; an answer that says the store
//! is throttling (`503 SlowDown`, `429`, a connection reset or closed mid-request) shrinks it to
//! three quarters (multiplicative decrease: at most once a round, the time the store takes to
//! answer, smoothed, and only for a request sent since the last decrease — a store's throttling
//! answers come back at once, and one burst of them is one signal, not a collapse to a single
//! request), and each window's worth of other answers grows it by one (additive increase), up to
//! the setting. A pass so runs at the store's pace without being told it.
//!
//! A window of one can still be too many: a store on loopback answers in well under a
//! millisecond, so one request at a time is a thousand a second or more, and a store's limit is a
//! rate (S3's is per prefix per second). Throttled at one, the window paces its requests instead
//! — a gap between two requests' starts, as many in flight as the setting allows, so that a
//! slow answer (a listing page) holds up no other — and the gap takes the same
//! turns as the window (longer on a throttling answer, shorter with each other answer) until it
//! is under a round, when the window alone paces again. Without it, behind a proxy allowing 300
//! requests a second, a window of one sent 1,000 and more: two thirds of them answered
//! `503`, 0.62 of the rate kept at 100 k objects.
//!
//! Each request is sent on a task of its own, so that its place comes back the moment the store
//! answers, whether or not its caller is looking: a caller's requests waiting unpolled (the trace
//! walk's signature reads, read ahead, while the walk deletes a batch) would otherwise keep
//! places the window has since shrunk to, and the requests the caller waits on would never get
//! one.
//!
//! A throttling status is retried here after a wait of about a round (drawn at random up to two
//! rounds: full jitter), the request keeping its place while it waits — a throttling answer
//! comes back at once, so a place given up then would send another request at once, and the
//! window would bound nothing; kept, the window bounds the retries as it bounds the requests, and
//! its decrease is the backoff. (A wait doubling with each try, the place given up, left a pass's
//! requests asleep for up to seconds while the store had room: 0.68 of the rate behind the
//! proxy.) It is retried until `object_store`'s own retry timeout has passed:
//! then the answer goes back to `object_store`, which finds its time up and fails the request.
//! `object_store`'s `RetryConfig` keeps retrying the rest as it always did (other 5xx answers,
//! transport errors — a reset among them, counted here as throttling as well — and timeouts of
//! safe requests): a throttled request is not one of its ten tries, so a store that throttles
//! for minutes does not fail a pass, and a store that is down is found down as soon as before.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

mod paced;

pub(super) use paced::Paced;

/// The round assumed until the store has answered: a store tens of milliseconds away.
const FIRST_ROUND: Duration = Duration::from_millis(50);

/// The longest gap between two requests' starts: a request a second. A store that answers
/// throttling through a long outage (a load balancer's `503`) would otherwise stretch the gap
/// by a seventh at each round of it, to tens of seconds after minutes, and requests signed
/// before their wait would come to the store too late for their signature.
const LONGEST_GAP: Duration = Duration::from_secs(1);

/// The window of one root: how many of its requests may be in flight now.
#[derive(Debug)]
pub struct Window {
    max: usize,
    state: Mutex<State>,
    /// Signalled when a place may have come free (a request ended, the window grew).
    freed: Notify,
}

#[derive(Debug)]
struct State {
    size: usize,
    in_flight: usize,
    /// Bumped at each decrease: an answer to a request sent before it is not a new signal.
    epoch: u64,
    /// Answers counted toward the next increase.
    answered: usize,
    /// How long the store takes to answer, smoothed (7/8 of the last value, 1/8 of the new,
    /// the new one at most two rounds).
    round: Duration,
    /// When the window last shrank.
    decreased_at: Option<Instant>,
    /// The smallest the window has been.
    lowest: usize,
    /// Throttling answers seen.
    throttled: u64,
    /// Below a window of one: the least time between two requests' starts. Zero while the
    /// window alone paces the requests.
    gap: Duration,
    /// The longest the gap has been.
    longest_gap: Duration,
    /// When the last request was sent.
    last_sent: Option<Instant>,
}

/// Whether a request may be sent now.
#[derive(Debug, PartialEq, Eq)]
enum Admit {
    /// Yes: it has its place.
    Now,
    /// Not before this wait: the gap since the last request is not over.
    After(Duration),
    /// Not before a place comes free.
    Full,
}

impl State {
    /// A place for a request at `now`, if one is free and the gap since the last one is over.
    /// While a gap paces the requests, `max` may be in flight: the gap paces their starts, and
    /// one slow to answer (a listing page the store walks for seconds) holds up no other.
    /// Without a gap, a free place is taken at once, whatever time the last request was sent.
    fn admit(&mut self, now: Instant, max: usize) -> Admit {
        let places = if self.gap.is_zero() { self.size } else { max };
        if self.in_flight >= places {
            return Admit::Full;
        }
        let due = self
            .last_sent
            .filter(|_| !self.gap.is_zero())
            .map(|last| last + self.gap);
        match due.map(|due| due.saturating_duration_since(now)) {
            Some(wait) if !wait.is_zero() => Admit::After(wait),
            _ => {
                self.in_flight += 1;
                self.last_sent = Some(self.last_sent.map_or(now, |last| last.max(now)));
                Admit::Now
            }
        }
    }

    /// A throttling answer, at `now`, to a request sent in `epoch`: the window shrinks to three
    /// quarters, at most once a round and only for a request sent since the last decrease. A
    /// window of one still too fast for the store (one that answers in well under a millisecond
    /// but allows a few hundred requests a second) spaces its requests out instead: the gap
    /// between two of them a seventh longer each time (the pace cut by an eighth), at first a
    /// seventh longer than a round, at most [`LONGEST_GAP`]: the pace saws between seven eighths
    /// of the store's rate and the whole of it.
    fn throttled(&mut self, epoch: u64, now: Instant) {
        self.throttled += 1;
        let round_over = self
            .decreased_at
            .is_none_or(|at| now.saturating_duration_since(at) >= self.round);
        if epoch != self.epoch || !round_over {
            return;
        }
        if self.size > 1 {
            self.size = (self.size * 3 / 4).max(1);
            self.lowest = self.lowest.min(self.size);
        } else {
            self.gap = (self.gap.max(self.round) * 8 / 7).min(LONGEST_GAP);
            self.longest_gap = self.longest_gap.max(self.gap);
        }
        self.epoch += 1;
        self.decreased_at = Some(now);
        self.answered = 0;
    }

    /// Another answer, after `took`: the round follows it. With a gap, each answer adds a
    /// request a second to the pace, until the gap is shorter than a round (the window of one
    /// then paces alone); without, each window's worth of answers grows the window by one, up
    /// to `max`. Whether the window grew.
    fn answered(&mut self, took: Duration, max: usize) -> bool {
        // A slow answer (a listing page the store walks for seconds) counts as two rounds at
        // most: it says little of how soon the store answers a HEAD, and taken whole it would
        // stretch every backoff after it, each throttled request keeping its place the while.
        let took = took.min(self.round * 2);
        self.round = self.round * 7 / 8 + took / 8;
        if !self.gap.is_zero() {
            let pace = 1.0 / self.gap.as_secs_f64() + 1.0;
            self.gap = Duration::from_secs_f64(1.0 / pace);
            if self.gap < self.round {
                self.gap = Duration::ZERO;
            }
            return false;
        }
        self.answered += 1;
        if self.answered >= self.size && self.size < max {
            self.size += 1;
            self.answered = 0;
            return true;
        }
        false
    }
}

/// What a window has seen, for a test or the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// Its size now.
    pub size: usize,
    /// The smallest it has been.
    pub lowest: usize,
    /// Throttling answers seen.
    pub throttled: u64,
    /// The time it puts between two requests now, below a window of one (zero above).
    pub gap: Duration,
    /// The longest that time has been.
    pub longest_gap: Duration,
}

impl Window {
    /// A window of `max` requests (at least one), open to all of them.
    pub fn new(max: usize) -> Self {
        let max = max.max(1);
        Self {
            max,
            state: Mutex::new(State {
                size: max,
                in_flight: 0,
                epoch: 0,
                answered: 0,
                round: FIRST_ROUND,
                decreased_at: None,
                lowest: max,
                throttled: 0,
                gap: Duration::ZERO,
                longest_gap: Duration::ZERO,
                last_sent: None,
            }),
            freed: Notify::new(),
        }
    }

    /// The most requests in flight it ever allows (`[storage] max_in_flight`).
    pub fn max(&self) -> usize {
        self.max
    }

    /// How long the store takes to answer, smoothed.
    fn round(&self) -> Duration {
        self.state().round
    }

    /// Its size now, the smallest it has been, and the throttling answers it has seen.
    pub fn seen(&self) -> Seen {
        let state = self.state();
        Seen {
            size: state.size,
            lowest: state.lowest,
            throttled: state.throttled,
            gap: state.gap,
            longest_gap: state.longest_gap,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A place in the window, once one is free and the gap since the last request is over.
    async fn enter(self: &Arc<Self>) -> Place {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            // The time read under the lock: read before it, a request that took the lock first
            // with a later time would be the last sent, and this one's gap counted from after it.
            let admitted = {
                let mut state = self.state();
                let now = Instant::now();
                (state.admit(now, self.max), state.epoch, now)
            };
            match admitted {
                (Admit::Now, epoch, now) => {
                    return Place {
                        window: self.clone(),
                        epoch,
                        sent: now,
                    };
                }
                (Admit::After(wait), ..) => tokio::time::sleep(wait).await,
                (Admit::Full, ..) => freed.await,
            }
        }
    }
}

/// One request's place in the window, given back when dropped.
struct Place {
    window: Arc<Window>,
    /// The window's epoch when the request was sent.
    epoch: u64,
    sent: Instant,
}

impl Place {
    /// The store answered at `now`; `throttled` when it said to slow down.
    fn answered(&self, throttled: bool, now: Instant) {
        let mut state = self.window.state();
        if throttled {
            state.throttled(self.epoch, now);
            return;
        }
        let took = now.saturating_duration_since(self.sent);
        if state.answered(took, self.window.max) {
            drop(state);
            self.window.freed.notify_waiters();
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.window.state().in_flight -= 1;
        self.window.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(window: &Arc<Window>, sent: Instant) -> Place {
        let mut state = window.state();
        state.in_flight += 1;
        Place {
            window: window.clone(),
            epoch: state.epoch,
            sent,
        }
    }

    #[test]
    fn pf7_throttling_shrinks_the_window_once_per_round_and_answers_grow_it_back() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let window = Arc::new(Window::new(16));
        let sent: Vec<Place> = (0..16).map(|_| place(&window, at(0))).collect();
        // Sixteen requests sent at size 16, three throttled: one decrease, not three.
        for place in &sent[..3] {
            place.answered(true, at(1));
        }
        assert_eq!(window.seen().size, 12);
        assert_eq!(window.seen().throttled, 3);
        drop(sent);
        // Sent after the decrease but answered within the same round: the same signal.
        place(&window, at(2)).answered(true, at(3));
        assert_eq!(window.seen().size, 12);
        // A round (50 ms until the store has answered) later: a new signal.
        place(&window, at(60)).answered(true, at(61));
        assert_eq!(window.seen().size, 9);
        // A window's worth of answers grows it by one.
        for _ in 0..9 {
            place(&window, at(100)).answered(false, at(140));
        }
        assert_eq!(window.seen().size, 10);
        for _ in 0..200 {
            place(&window, at(200)).answered(false, at(240));
        }
        assert_eq!(
            window.seen(),
            Seen {
                size: 16,
                lowest: 9,
                throttled: 5,
                gap: Duration::ZERO,
                longest_gap: Duration::ZERO,
            }
        );
        assert_eq!(window.state().round, Duration::from_millis(40));
        // A slow answer (a listing page the store took two seconds over) counts as two rounds:
        // the round moves by an eighth of that, not by a quarter of a second.
        place(&window, at(300)).answered(false, at(2300));
        assert_eq!(window.state().round, Duration::from_millis(45));
        assert_eq!(window.state().in_flight, 0);
    }

    #[test]
    fn pf7_a_window_of_one_still_throttled_spaces_its_requests_and_answers_close_the_gap() {
        let start = Instant::now();
        let at = |us: u64| start + Duration::from_micros(us);
        let window = Window::new(4);
        let mut state = window.state();
        // A store that answers in 400 µs.
        for _ in 0..200 {
            state.answered(Duration::from_micros(400), 4);
        }
        let round = state.round;
        assert!(round.abs_diff(Duration::from_micros(400)) < Duration::from_micros(1));
        // Throttled a round apart each time, the window shrinks to one: 4, 3, 2, 1.
        for n in 1..=3 {
            let epoch = state.epoch;
            state.throttled(epoch, at(n * 1000));
        }
        assert_eq!((state.size, state.gap), (1, Duration::ZERO));
        // Still throttled: the requests are spaced out, a seventh more than a round apart.
        let epoch = state.epoch;
        state.throttled(epoch, at(4000));
        let gap = state.gap;
        assert_eq!(gap, round * 8 / 7);
        assert_eq!(state.admit(at(5000), 4), Admit::Now);
        assert_eq!(
            state.admit(at(5100), 4),
            Admit::After(gap - Duration::from_micros(100)),
            "not before the gap is over"
        );
        // Its starts paced, as many in flight as the setting allows: a slow answer (a listing
        // page) holds up no other.
        assert_eq!(state.admit(at(5000) + gap, 4), Admit::Now);
        assert_eq!(state.admit(at(9000), 4), Admit::Now);
        assert_eq!(state.admit(at(10000), 4), Admit::Now);
        assert_eq!(state.admit(at(20000), 4), Admit::Full, "four at most");
        // Within the round, the same signal; a round later, a seventh more.
        let epoch = state.epoch;
        state.throttled(epoch, at(4100));
        assert_eq!(state.gap, gap);
        let epoch = state.epoch;
        state.throttled(epoch, at(5000));
        assert_eq!(state.gap, gap * 8 / 7);
        assert_eq!(state.longest_gap, gap * 8 / 7);
        assert_eq!(state.size, 1, "the window stays at one while the gap paces");
        // Each answer adds a request a second to the pace, until the gap is under a round:
        // from some 1,900 a second to 2,500 in some 590 answers.
        let mut answers = 0;
        while !state.gap.is_zero() {
            assert!(!state.answered(round, 4), "no growth while paced");
            answers += 1;
        }
        assert!((560..620).contains(&answers), "{answers} answers");
        // Then the window grows again, by one each window's worth of answers.
        assert!(state.answered(round, 4));
        assert_eq!(state.size, 2);
    }

    #[test]
    fn pf7_without_a_gap_a_free_place_is_taken_at_once_and_the_gap_has_a_ceiling() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let window = Window::new(4);
        let mut state = window.state();
        // Two requests whose times were read in one order and the lock taken in the other.
        assert_eq!(state.admit(at(5), 4), Admit::Now);
        assert_eq!(
            state.admit(at(4), 4),
            Admit::Now,
            "no wait for a place that is free"
        );
        assert_eq!(
            state.last_sent,
            Some(at(5)),
            "the last start never moves back"
        );
        // A store throttling for minutes (an outage answered 503): down to one, then paced, the
        // gap growing a seventh a round up to a request a second, no further.
        for n in 0..400 {
            let epoch = state.epoch;
            state.throttled(epoch, at(1000 * n));
        }
        assert_eq!((state.size, state.gap), (1, LONGEST_GAP));
        assert_eq!(state.longest_gap, LONGEST_GAP);
    }
}
