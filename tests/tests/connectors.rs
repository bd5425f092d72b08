//! Both adapters' `TcpConnector`s against real listeners on IPv6 literals: the loopback `::1`
//! (bare and bracketed) and, where the host has one, a link-local address with its zone
//! (`fe80::…%eth0`, bare and bracketed). A case whose address cannot be bound here (no IPv6 in
//! the container, no link-local address) prints why and passes.
//!
//! One check serves both connectors: the listener is std's blocking `TcpListener` (the kernel
//! completes the handshake; `accept` then returns at once), and only `connect` runs on each
//! runtime.

use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6, TcpListener};

use throttle_sansio::sync::Connector;

/// A listener on `at` and the host spellings a connector must reach it by, or `None` (printed)
/// where `at` cannot be bound.
fn listener(at: SocketAddrV6, hosts: Vec<String>) -> Option<(TcpListener, Vec<String>)> {
    match TcpListener::bind(at) {
        Ok(l) => Some((l, hosts)),
        Err(e) => {
            println!("skipped: cannot bind {at} here ({e})");
            None
        }
    }
}

fn loopback() -> Option<(TcpListener, Vec<String>)> {
    let at = SocketAddrV6::new(Ipv6Addr::LOCALHOST, 0, 0, 0);
    listener(at, vec!["::1".into(), "[::1]".into()])
}

/// The first link-local IPv6 address of an interface other than `lo`, from Linux's
/// `/proc/net/if_inet6` (lines of: address in 32 hex digits, interface index, prefix length,
/// scope, flags, name), with the interface's index and name.
fn link_local() -> Option<(TcpListener, Vec<String>)> {
    let Ok(table) = std::fs::read_to_string("/proc/net/if_inet6") else {
        println!("skipped: no /proc/net/if_inet6 to find a link-local address in");
        return None;
    };
    let found = table.lines().find_map(|line| {
        let [hex, index, _, scope, _, name] = line.split_whitespace().collect::<Vec<_>>()[..]
        else {
            return None;
        };
        if scope != "20" || name == "lo" {
            return None;
        }
        let addr = Ipv6Addr::from(u128::from_str_radix(hex, 16).ok()?);
        Some((addr, u32::from_str_radix(index, 16).ok()?, name.to_owned()))
    });
    let Some((addr, index, name)) = found else {
        println!("skipped: no link-local IPv6 address on this host");
        return None;
    };
    let at = SocketAddrV6::new(addr, 0, 0, index);
    listener(
        at,
        vec![format!("{addr}%{name}"), format!("[{addr}%{name}]")],
    )
}

/// Connects to `listener` by each of `hosts` with `connector` (`block_on` runs the connect
/// future on the runtime under test) and checks the connection reached it.
fn reaches<C: Connector<String>>(
    connector: &C,
    block_on: impl Fn(
        std::pin::Pin<Box<dyn Future<Output = Result<C::Conn, C::Error>> + Send>>,
    ) -> Result<C::Conn, C::Error>,
    peer: impl Fn(&C::Conn) -> SocketAddr,
    (listener, hosts): (TcpListener, Vec<String>),
) where
    C::Error: std::fmt::Display,
{
    let at = listener.local_addr().unwrap();
    for host in hosts {
        let conn = match block_on(Box::pin(connector.connect(
            &host,
            at.port(),
            throttle_sansio::conn_key::ConnectAttempt::new(
                throttle_sansio::Instant::ZERO,
                std::time::Duration::from_secs(20),
            ),
        ))) {
            Ok(conn) => conn,
            Err(e) => panic!("connect to host {host:?} port {}: {e}", at.port()),
        };
        let (_server, from) = listener.accept().unwrap();
        assert_eq!(peer(&conn), at, "{host:?}");
        assert_eq!(from.ip(), at.ip(), "{host:?}");
    }
}

fn on_tokio(case: Option<(TcpListener, Vec<String>)>) {
    let Some(case) = case else { return };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    reaches(
        &throttle_tokio::TcpConnector,
        |f| rt.block_on(f),
        |s| s.peer_addr().unwrap(),
        case,
    );
}

fn on_async_std(case: Option<(TcpListener, Vec<String>)>) {
    let Some(case) = case else { return };
    reaches(
        &throttle_async_std::TcpConnector,
        async_std::task::block_on,
        |s| s.peer_addr().unwrap(),
        case,
    );
}

#[test]
fn tokio_connector_reaches_ipv6_loopback_bare_and_bracketed() {
    on_tokio(loopback());
}

#[test]
fn async_std_connector_reaches_ipv6_loopback_bare_and_bracketed() {
    on_async_std(loopback());
}

#[test]
fn tokio_connector_reaches_a_link_local_address_with_its_zone_bare_and_bracketed() {
    on_tokio(link_local());
}

#[test]
fn async_std_connector_reaches_a_link_local_address_with_its_zone_bare_and_bracketed() {
    on_async_std(link_local());
}
