//! Network interface up/down with one `SIOCSIFFLAGS` ioctl: no fork, so the lab can time what
//! happens after a link change from the very moment it is made.

use nix::libc;

/// Why a link could not be changed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The name cannot be an interface name.
    #[error("interface name {0:?} is empty, longer than 15 bytes or contains NUL")]
    BadName(String),
    /// The kernel refused.
    #[error(
        "cannot set interface {name} {state}: {cause} (does it exist in this network namespace? are you root?)"
    )]
    Sys {
        /// Interface.
        name: String,
        /// `up` or `down`.
        state: &'static str,
        /// The errno.
        cause: nix::Error,
    },
}

/// Sets interface `name` (in the caller's network namespace) administratively up or down.
pub fn set_link(name: &str, up: bool) -> Result<(), LinkError> {
    let state = if up { "up" } else { "down" };
    if name.is_empty() || name.len() > 15 || name.contains('\0') {
        return Err(LinkError::BadName(name.to_owned()));
    }
    let fail = |cause| LinkError::Sys {
        name: name.to_owned(),
        state,
        cause,
    };
    // SAFETY: a datagram socket and SIOCGIFFLAGS/SIOCSIFFLAGS on a zeroed ifreq whose name is
    // NUL-terminated (checked length < IFNAMSIZ); the socket is closed on every path.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(fail(nix::Error::last()));
        }
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (dst, src) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
            *dst = src as libc::c_char;
        }
        let mut rc = libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr);
        if rc == 0 {
            let flag = libc::IFF_UP as libc::c_short;
            if up {
                ifr.ifr_ifru.ifru_flags |= flag;
            } else {
                ifr.ifr_ifru.ifru_flags &= !flag;
            }
            rc = libc::ioctl(fd, libc::SIOCSIFFLAGS, &ifr);
        }
        let errno = nix::Error::last();
        libc::close(fd);
        if rc != 0 {
            return Err(fail(errno));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_names_are_refused_before_any_syscall() {
        assert!(matches!(set_link("", true), Err(LinkError::BadName(_))));
        assert!(matches!(
            set_link("a-name-that-is-too-long", true),
            Err(LinkError::BadName(_))
        ));
    }

    #[test]
    fn a_missing_interface_is_named_in_the_error() {
        let err = set_link("nosuchif0", false).unwrap_err().to_string();
        assert!(err.contains("nosuchif0") && err.contains("down"), "{err}");
    }
}
