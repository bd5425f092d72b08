//! [`TcpConnector`]: the connection pool's connector over tokio's TCP.

use core::future::Future;

use throttle_sansio::sync::{Connector, bare_host};
use tokio::net::TcpStream;

/// Opens a `tokio::net::TcpStream` to `host:port` with `TCP_NODELAY` set, since pooled
/// requests are small and latency-bound. The host is a name (resolved by tokio), an IPv4
/// literal or an IPv6 literal, bare (`::1`) or bracketed (`[::1]`); it is resolved together
/// with the port as a pair ([`bare_host`]), never as a `"{host}:{port}"` string. Wrap it to add
/// a handshake or a multiplexing client on top: the pool shares one connection between its
/// leases. It ignores the [`ConnectAttempt`](throttle_sansio::conn_key::ConnectAttempt): the
/// pool drops a connect still running at the attempt's deadline.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpConnector;

impl<H: AsRef<str>> Connector<H> for TcpConnector {
    type Conn = TcpStream;
    type Error = std::io::Error;

    fn connect(
        &self,
        host: &H,
        port: u16,
        _attempt: throttle_sansio::conn_key::ConnectAttempt,
    ) -> impl Future<Output = Result<TcpStream, std::io::Error>> + Send + 'static {
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

    #[tokio::test]
    async fn connects_to_a_loopback_listener_with_nodelay() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let stream = TcpConnector
            .connect(&"127.0.0.1", port, attempt())
            .await
            .unwrap();
        assert!(stream.nodelay().unwrap());
        assert_eq!(stream.peer_addr().unwrap().port(), port);
    }
}
