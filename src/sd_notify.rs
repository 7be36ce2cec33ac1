//! systemd's service notification protocol (`sd_notify(3)`), for `gatehouse serve` under a
//! `Type=notify` unit (deploy/gatehouse.service): one datagram per state change to the socket
//! `$NOTIFY_SOCKET` names (a path, or `@name` in the abstract namespace), and the watchdog
//! interval `$WATCHDOG_USEC` asks for. Outside systemd there is no `NOTIFY_SOCKET` and no
//! [`Notifier`]. Datagrams are sent without blocking: a stuck manager costs an error, never a
//! worker thread.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::time::Duration;

/// `READY=1`: start-up is done (the listeners answer), or a reload is applied or refused.
pub const READY: &str = "READY=1";
/// `STOPPING=1`: the service is draining.
pub const STOPPING: &str = "STOPPING=1";
/// `WATCHDOG=1`: the keep-alive systemd expects every `WATCHDOG_USEC`.
pub const WATCHDOG: &str = "WATCHDOG=1";

/// Where notifications go. Cheap to share behind an `Arc` (sends take `&self`).
#[derive(Debug)]
pub struct Notifier {
    socket: UnixDatagram,
    target: SocketAddr,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// From the process environment: `None` when `NOTIFY_SOCKET` is unset or empty (not
    /// started by systemd, or by a unit that does not listen).
    pub fn from_env() -> io::Result<Option<Self>> {
        let Some(socket) = std::env::var_os("NOTIFY_SOCKET").filter(|s| !s.is_empty()) else {
            return Ok(None);
        };
        let watchdog = watchdog_interval(
            std::env::var("WATCHDOG_USEC").ok().as_deref(),
            std::env::var("WATCHDOG_PID").ok().as_deref(),
            std::process::id(),
        );
        Self::new(&socket, watchdog).map(Some)
    }

    /// A notifier for the socket `name` (a path, or `@name` for the abstract namespace) that
    /// pings the watchdog every `watchdog` (see [`watchdog_interval`]).
    pub fn new(name: &OsStr, watchdog: Option<Duration>) -> io::Result<Self> {
        let target = address(name)?;
        let socket = UnixDatagram::unbound()?;
        socket.set_nonblocking(true)?;
        Ok(Self {
            socket,
            target,
            watchdog,
        })
    }

    /// Sends one notification: newline-separated `KEY=VALUE` assignments.
    pub fn notify(&self, state: &str) -> io::Result<()> {
        let sent = self.socket.send_to_addr(state.as_bytes(), &self.target)?;
        if sent != state.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "notification datagram truncated",
            ));
        }
        Ok(())
    }

    /// How often to send [`WATCHDOG`]: half of `WATCHDOG_USEC`, as systemd advises; `None`
    /// when the unit sets no `WatchdogSec=`.
    pub fn watchdog_every(&self) -> Option<Duration> {
        self.watchdog
    }
}

/// `RELOADING=1` with the `MONOTONIC_USEC` systemd ≥ 253 (`Type=notify-reload`) requires to
/// tell this reload from an earlier one; older managers ignore the extra field.
pub fn reloading() -> io::Result<String> {
    Ok(format!("RELOADING=1\nMONOTONIC_USEC={}", monotonic_usec()?))
}

/// `CLOCK_MONOTONIC` in microseconds (the clock systemd's `MONOTONIC_USEC` is read on).
pub fn monotonic_usec() -> io::Result<u64> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)?;
    let secs = u64::try_from(t.tv_sec()).map_err(|_| io::ErrorKind::InvalidData)?;
    let nanos = u64::try_from(t.tv_nsec()).map_err(|_| io::ErrorKind::InvalidData)?;
    Ok(secs.saturating_mul(1_000_000).saturating_add(nanos / 1_000))
}

/// The keep-alive interval from `WATCHDOG_USEC` and `WATCHDOG_PID` (`me`: this process's
/// id): half the timeout, or `None` when unset, zero, unparsable, or meant for another
/// process (a child that inherited the variables).
pub fn watchdog_interval(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok() != Some(me) {
            return None;
        }
    }
    let usec: u64 = usec?.trim().parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec / 2).max(Duration::from_millis(1)))
}

/// `@name` is the abstract namespace (the `@` stands for the leading NUL); anything else is a
/// filesystem path.
fn address(name: &OsStr) -> io::Result<SocketAddr> {
    match name.as_bytes() {
        [] => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "NOTIFY_SOCKET is empty",
        )),
        [b'@', rest @ ..] => SocketAddr::from_abstract_name(rest),
        _ => SocketAddr::from_pathname(PathBuf::from(OsString::from(name))),
    }
}

// Unit tests only (never built into the daemon): a panic here is the test failing.
#[cfg(test)]
mod tests {
    use super::*;

    fn recv(sock: &UnixDatagram) -> String {
        let mut buf = [0u8; 512];
        let n = sock.recv(&mut buf).unwrap();
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    #[test]
    fn a_path_socket_gets_one_datagram_per_notification() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let listener = UnixDatagram::bind(&path).unwrap();
        listener
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let n = Notifier::new(path.as_os_str(), None).unwrap();
        n.notify(READY).unwrap();
        n.notify(STOPPING).unwrap();
        assert_eq!(recv(&listener), "READY=1");
        assert_eq!(recv(&listener), "STOPPING=1");
    }

    #[test]
    fn an_at_sign_names_the_abstract_namespace() {
        let name = format!(
            "gatehouse-test-{}-{}",
            std::process::id(),
            rand::random::<u64>()
        );
        let listener =
            UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap())
                .unwrap();
        listener
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let n = Notifier::new(OsStr::new(&format!("@{name}")), None).unwrap();
        n.notify(WATCHDOG).unwrap();
        assert_eq!(recv(&listener), "WATCHDOG=1");
        // No file of that name was made or used.
        assert!(!std::path::Path::new(&format!("@{name}")).exists());
    }

    #[test]
    fn nobody_listening_is_an_error_not_a_hang() {
        let dir = tempfile::tempdir().unwrap();
        let n = Notifier::new(dir.path().join("absent.sock").as_os_str(), None).unwrap();
        assert!(n.notify(READY).is_err());
        assert!(Notifier::new(OsStr::new(""), None).is_err());
    }

    #[test]
    fn reloading_carries_the_monotonic_clock() {
        let before = monotonic_usec().unwrap();
        let msg = reloading().unwrap();
        let after = monotonic_usec().unwrap();
        let mut lines = msg.lines();
        assert_eq!(lines.next(), Some("RELOADING=1"));
        let usec: u64 = lines
            .next()
            .and_then(|l| l.strip_prefix("MONOTONIC_USEC="))
            .unwrap()
            .parse()
            .unwrap();
        assert!(before <= usec && usec <= after, "{before} {usec} {after}");
        // The same clock as std's Instant (CLOCK_MONOTONIC on Linux), not the wall clock.
        assert!(usec < 10 * 365 * 24 * 3600 * 1_000_000, "{usec}");
    }

    #[test]
    fn the_watchdog_pings_at_half_the_timeout_for_this_process_only() {
        assert_eq!(
            watchdog_interval(Some("3000000"), None, 7),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            watchdog_interval(Some("3000000"), Some("7"), 7),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(watchdog_interval(Some("3000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval(None, None, 7), None);
        assert_eq!(watchdog_interval(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval(Some("soon"), None, 7), None);
    }
}
