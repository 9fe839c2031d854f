//! A minimal TCP relay (`baton chaos relay --pair LISTEN=TARGET ...`), run as one detached process
//! in the root namespace by a `--netns` fleet: it makes servers whose launchers bind loopback only
//! (Redis, ZooKeeper) reachable on the bridge's election address. Byte-for-byte, both directions;
//! a connection that stalls on one side (a DROP rule in a node's namespace) stalls end to end, so
//! the server sees its client go silent exactly as it would without the relay.

use std::net::SocketAddr;

use anyhow::{bail, Context};

/// Parses `LISTEN=TARGET` (two `ip:port`).
pub fn parse_pair(s: &str) -> anyhow::Result<(SocketAddr, SocketAddr)> {
    let Some((l, t)) = s.split_once('=') else {
        bail!("--pair {s:?}: expected LISTEN=TARGET, e.g. 10.213.0.2:6379=127.0.0.1:6379");
    };
    Ok((
        l.parse().with_context(|| format!("listen address {l:?}"))?,
        t.parse().with_context(|| format!("target address {t:?}"))?,
    ))
}

/// Binds every listen address, then relays until SIGTERM / Ctrl-C.
pub async fn run(pairs: Vec<(SocketAddr, SocketAddr)>) -> anyhow::Result<()> {
    if pairs.is_empty() {
        bail!("nothing to relay (give --pair LISTEN=TARGET)");
    }
    let mut tasks = Vec::new();
    for (listen, target) in pairs {
        let l = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        tasks.push(tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = l.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    let _ = inbound.set_nodelay(true);
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = outbound.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
            }
        }));
        eprintln!("relay {listen} -> {target}");
    }
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    for t in tasks {
        t.abort();
    }
    Ok(())
}
