//! The one retry schedule: a delay that doubles from `initial` up to `max` after each failure and
//! goes back to `initial` after a success. A plain value (no clock, no sleeping): the loop that
//! retries sleeps for what [`Backoff::next_delay`] returns.

use std::time::Duration;

/// Exponential backoff with a ceiling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    /// Starts at `initial`, doubling to at most `max` (`max` below `initial` is raised to it).
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max: max.max(initial),
            current: initial,
        }
    }

    /// The delay the next failure will wait.
    pub fn peek(&self) -> Duration {
        self.current
    }

    /// The delay to wait after a failure; the one after it is twice as long (up to `max`).
    pub fn next_delay(&mut self) -> Duration {
        let d = self.current;
        self.current = self.current.saturating_mul(2).min(self.max);
        d
    }

    /// After a success: the next failure waits `initial` again.
    pub fn reset(&mut self) {
        self.current = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_ceiling_and_resets() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(50), ms(300));
        let got: Vec<Duration> = (0..5).map(|_| b.next_delay()).collect();
        assert_eq!(got, [ms(50), ms(100), ms(200), ms(300), ms(300)]);
        assert_eq!(b.peek(), ms(300));
        b.reset();
        assert_eq!(b.next_delay(), ms(50));
        let mut low = Backoff::new(ms(10), ms(1));
        assert_eq!((low.next_delay(), low.next_delay()), (ms(10), ms(10)));
        let mut huge = Backoff::new(Duration::MAX, Duration::MAX);
        assert_eq!(huge.next_delay(), Duration::MAX);
    }
}
