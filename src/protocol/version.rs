//! Protocol revisions: the one list of versions served, and what is read from it.

/// A protocol revision the gateway serves, oldest first (`Ord` is age).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    V2024_11_05,
    /// The one revision whose clients may send JSON-RPC batches.
    V2025_03_26,
    V2025_06_18,
    V2025_11_25,
    /// The stateless revision (no `initialize`, no session).
    V2026_07_28,
}

impl Version {
    /// Every revision served, oldest first: the handshake-era ones, then the stateless one.
    pub const ALL: [Version; 5] = [
        Version::V2024_11_05,
        Version::V2025_03_26,
        Version::V2025_06_18,
        Version::V2025_11_25,
        Version::V2026_07_28,
    ];
    /// The newest handshake-era revision (what `initialize` answers for an unknown version).
    pub const LATEST_LEGACY: Version = Version::V2025_11_25;
    /// The stateless revision.
    pub const MODERN: Version = Version::V2026_07_28;
    /// What a handshake-era request without `MCP-Protocol-Version` is assumed to speak, and
    /// the one revision whose clients may send JSON-RPC batches.
    pub const BATCH: Version = Version::V2025_03_26;
    /// Priming events (empty data with an id) go to clients at this revision or later.
    pub const PRIMING_SINCE: Version = Version::V2025_11_25;

    /// The revision as the protocol writes it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Version::V2024_11_05 => "2024-11-05",
            Version::V2025_03_26 => "2025-03-26",
            Version::V2025_06_18 => "2025-06-18",
            Version::V2025_11_25 => "2025-11-25",
            Version::V2026_07_28 => "2026-07-28",
        }
    }

    /// A revision served, by its name (None: not one the gateway serves).
    pub fn parse(name: &str) -> Option<Version> {
        Version::ALL.into_iter().find(|v| v.as_str() == name)
    }

    /// A handshake-era revision (`initialize` and a session)?
    pub const fn is_legacy(self) -> bool {
        !matches!(self, Version::V2026_07_28)
    }

    /// The version `initialize` answers: the client's if it is a handshake-era one served,
    /// else the latest.
    pub fn negotiate(requested: Option<&str>) -> Version {
        requested
            .and_then(Version::parse)
            .filter(|v| v.is_legacy())
            .unwrap_or(Version::LATEST_LEGACY)
    }
}

/// Every revision served, oldest first, as written ([`Version::ALL`]).
pub const ALL_VERSIONS: &[&str] = &[
    Version::V2024_11_05.as_str(),
    Version::V2025_03_26.as_str(),
    Version::V2025_06_18.as_str(),
    Version::V2025_11_25.as_str(),
    Version::V2026_07_28.as_str(),
];
/// Handshake-era revisions, oldest first.
pub const LEGACY_VERSIONS: &[&str] = ALL_VERSIONS.split_at(ALL_VERSIONS.len() - 1).0;
/// [`Version::LATEST_LEGACY`] as written.
pub const LATEST_LEGACY: &str = Version::LATEST_LEGACY.as_str();
/// [`Version::MODERN`] as written.
pub const MODERN_VERSION: &str = Version::MODERN.as_str();
/// [`Version::BATCH`] as written.
pub const BATCH_VERSION: &str = Version::BATCH.as_str();

/// Picks the version `initialize` answers ([`Version::negotiate`]), as written.
pub fn negotiate(requested: Option<&str>) -> &'static str {
    Version::negotiate(requested).as_str()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one list, and what is read from it.
    #[test]
    fn protocol_versions_come_from_one_list() {
        assert_eq!(LEGACY_VERSIONS, &ALL_VERSIONS[..4]);
        assert_eq!(
            (
                LATEST_LEGACY,
                MODERN_VERSION,
                BATCH_VERSION,
                Version::PRIMING_SINCE.as_str()
            ),
            ("2025-11-25", "2026-07-28", "2025-03-26", "2025-11-25")
        );
        assert_eq!(MODERN_VERSION, crate::config::MODERN_PROTOCOL);
        for v in Version::ALL {
            assert_eq!(Version::parse(v.as_str()), Some(v));
            assert_eq!(v.is_legacy(), LEGACY_VERSIONS.contains(&v.as_str()));
        }
        assert!(Version::ALL.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn initialize_answers_the_clients_handshake_version_or_the_latest() {
        assert_eq!(negotiate(Some("2025-03-26")), "2025-03-26");
        assert_eq!(negotiate(Some("2026-07-28")), LATEST_LEGACY);
        assert_eq!(negotiate(Some("1999-01-01")), LATEST_LEGACY);
        assert_eq!(negotiate(None), LATEST_LEGACY);
    }
}
