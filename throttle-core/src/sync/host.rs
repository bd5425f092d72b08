//! [`bare_host`]: the host of a connect target as a resolver takes it (used by the adapters'
//! TCP connectors).

/// The host of a connect target as a name resolver takes it: an IPv6 literal written in
/// brackets, as URLs and `host:port` strings write it (`[::1]`, `[2001:db8::1]`), loses its
/// brackets; any other host (a name, a bare IPv4 or IPv6 literal) is returned unchanged. Only a
/// bracketed host that contains a `:` counts as an IPv6 literal, so `[db-0]` stays as it is
/// (and the resolver refuses it).
///
/// A [`Connector`](super::Connector) gets the host and the port apart; it should resolve them
/// as a pair (`(bare_host(host), port)`), not by formatting `"{host}:{port}"` and parsing that
/// back, which depends on how the resolver splits a string with many colons.
///
/// ```
/// use throttle_sansio::sync::bare_host;
///
/// assert_eq!(bare_host("[::1]"), "::1");
/// assert_eq!(bare_host("::1"), "::1");
/// assert_eq!(bare_host("127.0.0.1"), "127.0.0.1");
/// assert_eq!(bare_host("db-0.example"), "db-0.example");
/// assert_eq!(bare_host("[db-0]"), "[db-0]");
/// ```
pub fn bare_host(host: &str) -> &str {
    match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(inner) if inner.contains(':') => inner,
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::bare_host;

    #[test]
    fn only_a_bracketed_ipv6_literal_loses_its_brackets() {
        for (given, bare) in [
            ("[::1]", "::1"),
            ("[2001:db8::7]", "2001:db8::7"),
            ("[fe80::1%eth0]", "fe80::1%eth0"),
            ("::1", "::1"),
            ("10.0.0.1", "10.0.0.1"),
            ("localhost", "localhost"),
            ("[localhost]", "[localhost]"),
            ("[::1", "[::1"),
            ("::1]", "::1]"),
            ("[]", "[]"),
            ("[::1]:9000", "[::1]:9000"),
            ("", ""),
        ] {
            assert_eq!(bare_host(given), bare, "{given:?}");
        }
    }
}
