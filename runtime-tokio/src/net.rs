//! [`TcpConnector`]: the connection pool's connector over tokio's TCP.

use core::future::Future;

use throttle_core::sync::Connector;
use tokio::net::TcpStream;

/// Opens a `tokio::net::TcpStream` to `host:port` (host resolved by tokio), with `TCP_NODELAY`
/// set unless turned off. The pool shares one connection between leases (`&TcpStream`):
/// wrap this connector to put a multiplexing client on top.
#[derive(Debug, Clone, Copy)]
pub struct TcpConnector {
    nodelay: bool,
}

impl TcpConnector {
    /// A connector setting `TCP_NODELAY` (requests are small and latency-bound).
    pub fn new() -> Self {
        TcpConnector { nodelay: true }
    }

    /// This connector with `TCP_NODELAY` set to `nodelay`.
    pub fn with_nodelay(self, nodelay: bool) -> Self {
        TcpConnector { nodelay }
    }
}

impl Default for TcpConnector {
    fn default() -> Self {
        Self::new()
    }
}

impl<H: AsRef<str>> Connector<H> for TcpConnector {
    type Conn = TcpStream;
    type Error = std::io::Error;

    fn connect(
        &self,
        host: &H,
        port: u16,
    ) -> impl Future<Output = Result<TcpStream, std::io::Error>> + Send + 'static {
        let (host, nodelay) = (host.as_ref().to_owned(), self.nodelay);
        async move {
            let stream = TcpStream::connect((host.as_str(), port)).await?;
            stream.set_nodelay(nodelay)?;
            Ok(stream)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connects_to_a_loopback_listener_with_nodelay() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let stream = TcpConnector::new()
            .connect(&"127.0.0.1", port)
            .await
            .unwrap();
        assert!(stream.nodelay().unwrap());
        assert_eq!(stream.peer_addr().unwrap().port(), port);
    }
}
