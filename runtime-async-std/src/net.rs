//! [`TcpConnector`]: the connection pool's connector over async-std's TCP.

use core::future::Future;

use std::io;

use async_std::net::TcpStream;
use throttle_sansio::sync::{Connector, bare_host};

/// Opens an `async_std::net::TcpStream` to `host:port` with `TCP_NODELAY` set, since pooled
/// requests are small and latency-bound. The host is a name (resolved by async-std), an IPv4
/// literal or an IPv6 literal, bare (`::1`) or bracketed (`[::1]`); it is resolved together
/// with the port as a pair ([`bare_host`]), never as a `"{host}:{port}"` string. Wrap it to add
/// a handshake or a multiplexing client on top: the pool shares one connection between its
/// leases. It ignores the [`ConnectAttempt`](throttle_sansio::conn_key::ConnectAttempt): the
/// pool drops a connect still running at the attempt's deadline.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpConnector;

impl<H: AsRef<str>> Connector<H> for TcpConnector {
    type Error = io::Error;
    type Conn = TcpStream;

    fn connect(
        &self,
        host: &H,
        port: u16,
        _attempt: throttle_sansio::conn_key::ConnectAttempt,
    ) -> impl Future<Output = io::Result<TcpStream>> + Send + 'static {
        let host = bare_host(host.as_ref()).to_owned();
        async move {
            let stream = TcpStream::connect((host.as_str(), port)).await?;
            stream.set_nodelay(true)?;
            Ok(stream)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connect attempt as the pool hands it out (the pool enforces its deadline).
    fn attempt() -> throttle_sansio::conn_key::ConnectAttempt {
        throttle_sansio::conn_key::ConnectAttempt::new(
            throttle_sansio::Instant::ZERO,
            core::time::Duration::from_secs(20),
        )
    }
    use async_std::io::{ReadExt, WriteExt};
    use async_std::net::TcpListener;

    #[test]
    fn connected_stream_reaches_the_listener_and_has_nodelay_set() {
        async_std::task::block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let mut client = TcpConnector
                .connect(&"127.0.0.1", addr.port(), attempt())
                .await
                .unwrap();
            let (mut server, _) = listener.accept().await.unwrap();
            client.write_all(b"ping").await.unwrap();
            let mut got = [0u8; 4];
            server.read_exact(&mut got).await.unwrap();
            assert_eq!((&got, client.nodelay().unwrap()), (b"ping", true));
        });
    }
}
