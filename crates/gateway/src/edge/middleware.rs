//! The one `ProxyHttp` implementation: [`WithDomainRisk`] runs the gateway's phases for the
//! requests it claims (the mounted path prefixes) and the host proxy's for every other request.
//! The standalone gateway is the same wrapper around a host that claims nothing of its own.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use pingora::cache::key::HashBinary;
use pingora::cache::{
    CacheKey, CacheMeta, ForcedFreshness, HitHandler, PurgeAction, RespCacheable,
};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::modules::http::HttpModules;
use pingora::prelude::*;
use pingora::protocols::Digest;
use pingora::proxy::{FailToProxy, ProxyWarnLogContext, PurgeStatus, RangeType};

use super::gateway::{Gateway, RequestCtx};
use super::mount::Mount;

/// The host's `ProxyHttp` with the domain-risk routes mounted in front of it.
///
/// Made by [`DomainRisk::wrap`](crate::DomainRisk::wrap). A request whose path starts with a
/// mounted prefix (`/v1/` by default) goes through the domain-risk gateway's phases only: key,
/// origin, rate and quota checks, the answer from the domain table, `/v1/check` to the
/// configured backend. Every other request goes through the host's own callbacks, untouched.
/// The host's [`ProxyHttp::logging`] runs for every request, the gateway's included (after
/// the gateway's own), so a host's access log and metrics see all traffic.
pub struct WithDomainRisk<H> {
    gateway: Arc<Gateway>,
    mount: Arc<Mount>,
    host: H,
}

impl<H> WithDomainRisk<H> {
    pub(crate) fn new(gateway: Arc<Gateway>, mount: Arc<Mount>, host: H) -> Self {
        WithDomainRisk {
            gateway,
            mount,
            host,
        }
    }

    /// The host proxy inside.
    pub fn host(&self) -> &H {
        &self.host
    }
}

/// The per-request context of [`WithDomainRisk`]: the host's own context, and the gateway's
/// for a request it claimed.
pub struct Ctx<C> {
    /// `Some` once the request is known to be the gateway's (its path is mounted). Boxed: the
    /// context lives in Pingora's request future, which is moved a few times a request, and a
    /// pointer moves cheaper than the context's 400 bytes.
    ours: Option<Box<RequestCtx>>,
    /// The host's context, made by the host's `new_ctx` for every request.
    pub host: C,
}

impl<C> Ctx<C> {
    /// Whether the domain-risk gateway answers this request (its path is mounted).
    pub fn is_domain_risk(&self) -> bool {
        self.ours.is_some()
    }
}

/// Runs the gateway's phase when the request is ours, else the host's.
macro_rules! either {
    ($self:ident, $ctx:ident, |$ours:ident| $mine:expr, |$host:ident| $theirs:expr) => {
        match &mut $ctx.ours {
            Some($ours) => $mine,
            None => {
                let $host = &mut $ctx.host;
                $theirs
            }
        }
    };
}

/// The phases only a host has (its cache, ranges, purges, connection reuse), handed to it as they
/// are with its own context: one line each, the callback's signature with `ctx mut` or `ctx ref`
/// where the context goes.
macro_rules! host_only {
    ($(fn $name:ident($($a:ident: $at:ty),* ; ctx $m:ident $(, $b:ident: $bt:ty)*) $(-> $ret:ty)?;)*) => {
        $(
            fn $name(&self, $($a: $at,)* ctx: host_only!(@ctx $m), $($b: $bt),*) $(-> $ret)? {
                self.host.$name($($a,)* host_only!(@host ctx $m), $($b),*)
            }
        )*
    };
    (@ctx mut) => { &mut Self::CTX };
    (@ctx ref) => { &Self::CTX };
    (@host $ctx:ident mut) => { &mut $ctx.host };
    (@host $ctx:ident ref) => { &$ctx.host };
}

#[async_trait]
impl<H> ProxyHttp for WithDomainRisk<H>
where
    H: ProxyHttp + Send + Sync,
    H::CTX: Send + Sync,
{
    type CTX = Ctx<H::CTX>;

    fn new_ctx(&self) -> Self::CTX {
        Ctx {
            // The standalone gateway claims every request before its path is looked at.
            ours: (*self.mount == Mount::All).then(|| Box::new(self.gateway.new_ctx())),
            host: self.host.new_ctx(),
        }
    }

    /// The host's modules (the standalone gateway has none: each module costs every request).
    fn init_downstream_modules(&self, modules: &mut HttpModules) {
        self.host.init_downstream_modules(modules);
    }

    async fn early_request_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<()> {
        if ctx.ours.is_none() && self.mount.claims(session.req_header().uri.path()) {
            ctx.ours = Some(Box::new(self.gateway.new_ctx()));
        }
        either!(
            self,
            ctx,
            |ours| self.gateway.early_request_filter(session, ours).await,
            |host| self.host.early_request_filter(session, host).await
        )
    }

    fn allow_spawning_subrequest(&self, session: &Session, ctx: &Self::CTX) -> bool {
        ctx.ours.is_none() && self.host.allow_spawning_subrequest(session, &ctx.host)
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<bool> {
        either!(
            self,
            ctx,
            |ours| self.gateway.request_filter(session, ours).await,
            |host| self.host.request_filter(session, host).await
        )
    }

    async fn request_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        either!(self, ctx, |_ours| Ok(()), |host| self
            .host
            .request_body_filter(session, body, end_of_stream, host)
            .await)
    }

    fn request_cache_filter(&self, session: &mut Session, ctx: &mut Self::CTX) -> Result<()> {
        either!(self, ctx, |_ours| Ok(()), |host| self
            .host
            .request_cache_filter(session, host))
    }

    async fn cache_hit_filter(
        &self,
        session: &mut Session,
        meta: &CacheMeta,
        hit_handler: &mut HitHandler,
        is_fresh: bool,
        ctx: &mut Self::CTX,
    ) -> Result<Option<ForcedFreshness>> {
        self.host
            .cache_hit_filter(session, meta, hit_handler, is_fresh, &mut ctx.host)
            .await
    }

    async fn proxy_upstream_filter(
        &self,
        session: &mut Session,
        ctx: &mut Self::CTX,
    ) -> Result<bool> {
        either!(self, ctx, |_ours| Ok(true), |host| self
            .host
            .proxy_upstream_filter(session, host)
            .await)
    }

    async fn upstream_peer(
        &self,
        session: &mut Session,
        ctx: &mut Self::CTX,
    ) -> Result<Box<HttpPeer>> {
        either!(
            self,
            ctx,
            |ours| self.gateway.upstream_peer(session, ours).await,
            |host| self.host.upstream_peer(session, host).await
        )
    }

    async fn connected_to_upstream(
        &self,
        session: &mut Session,
        reused: bool,
        peer: &HttpPeer,
        fd: std::os::unix::io::RawFd,
        digest: Option<&Digest>,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        either!(self, ctx, |_ours| Ok(()), |host| self
            .host
            .connected_to_upstream(session, reused, peer, fd, digest, host)
            .await)
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        either!(
            self,
            ctx,
            |ours| self
                .gateway
                .upstream_request_filter(session, upstream_request, ours)
                .await,
            |host| self
                .host
                .upstream_request_filter(session, upstream_request, host)
                .await
        )
    }

    async fn upstream_response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        either!(self, ctx, |_ours| Ok(()), |host| self
            .host
            .upstream_response_filter(session, upstream_response, host)
            .await)
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        either!(
            self,
            ctx,
            |ours| self
                .gateway
                .response_filter(session, upstream_response, ours)
                .await,
            |host| self
                .host
                .response_filter(session, upstream_response, host)
                .await
        )
    }

    fn upstream_response_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<Option<Duration>> {
        either!(self, ctx, |_ours| Ok(None), |host| self
            .host
            .upstream_response_body_filter(
                session,
                body,
                end_of_stream,
                host
            ))
    }

    fn upstream_response_trailer_filter(
        &self,
        session: &mut Session,
        trailers: &mut http::HeaderMap,
        ctx: &mut Self::CTX,
    ) -> Result<()> {
        either!(self, ctx, |_ours| Ok(()), |host| self
            .host
            .upstream_response_trailer_filter(session, trailers, host))
    }

    fn response_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Self::CTX,
    ) -> Result<Option<Duration>> {
        either!(
            self,
            ctx,
            |ours| self
                .gateway
                .response_body_filter(session, body, end_of_stream, ours),
            |host| self
                .host
                .response_body_filter(session, body, end_of_stream, host)
        )
    }

    async fn response_trailer_filter(
        &self,
        session: &mut Session,
        trailers: &mut http::HeaderMap,
        ctx: &mut Self::CTX,
    ) -> Result<Option<Bytes>> {
        either!(self, ctx, |_ours| Ok(None), |host| self
            .host
            .response_trailer_filter(session, trailers, host)
            .await)
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Self::CTX) {
        if let Some(ours) = &mut ctx.ours {
            self.gateway.logging(session, e, ours).await;
        }
        self.host.logging(session, e, &mut ctx.host).await;
    }

    fn suppress_error_log(&self, session: &Session, ctx: &Self::CTX, error: &Error) -> bool {
        match &ctx.ours {
            Some(ours) => self.gateway.suppress_error_log(session, ours, error),
            None => self.host.suppress_error_log(session, &ctx.host, error),
        }
    }

    fn suppress_proxy_warn_log(
        &self,
        session: &Session,
        ctx: &Self::CTX,
        error: &Error,
        context: ProxyWarnLogContext,
    ) -> bool {
        self.host
            .suppress_proxy_warn_log(session, &ctx.host, error, context)
    }

    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut Self::CTX,
        client_reused: bool,
    ) -> Box<Error> {
        match &mut ctx.ours {
            // Pingora's own policy (no retry of what is not idempotent), as before embedding.
            Some(_) => {
                let mut e = e.more_context(format!("Peer: {peer}"));
                if !session.req_header().method.is_idempotent()
                    || session.as_ref().retry_buffer_truncated()
                {
                    e.set_retry(false);
                } else {
                    e.retry.decide_reuse(client_reused);
                }
                e
            }
            None => self
                .host
                .error_while_proxy(peer, session, e, &mut ctx.host, client_reused),
        }
    }

    fn fail_to_connect(
        &self,
        session: &mut Session,
        peer: &HttpPeer,
        ctx: &mut Self::CTX,
        e: Box<Error>,
    ) -> Box<Error> {
        either!(
            self,
            ctx,
            |ours| self.gateway.fail_to_connect(session, peer, ours, e),
            |host| self.host.fail_to_connect(session, peer, host, e)
        )
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut Self::CTX,
    ) -> FailToProxy {
        either!(
            self,
            ctx,
            |ours| self.gateway.fail_to_proxy(session, e, ours).await,
            |host| self.host.fail_to_proxy(session, e, host).await
        )
    }

    fn request_summary(&self, session: &Session, ctx: &Self::CTX) -> String {
        match &ctx.ours {
            Some(ours) => self.gateway.request_summary(session, ours),
            None => self.host.request_summary(session, &ctx.host),
        }
    }

    fn is_purge(&self, session: &Session, ctx: &Self::CTX) -> bool {
        ctx.ours.is_none() && self.host.is_purge(session, &ctx.host)
    }

    // Only reached when the host's own phases turned its cache on, which the gateway's never
    // do; and the host's connection reuse.
    host_only! {
        fn cache_key_callback(session: &Session; ctx mut) -> Result<CacheKey>;
        fn cache_miss(session: &mut Session; ctx mut);
        fn response_cache_filter(session: &Session, resp: &ResponseHeader; ctx mut)
            -> Result<RespCacheable>;
        fn cache_vary_filter(meta: &CacheMeta; ctx mut, req: &RequestHeader) -> Option<HashBinary>;
        fn cache_not_modified_filter(session: &Session, resp: &ResponseHeader; ctx mut)
            -> Result<bool>;
        fn range_header_filter(session: &mut Session, resp: &mut ResponseHeader; ctx mut)
            -> RangeType;
        fn should_serve_stale(session: &mut Session; ctx mut, error: Option<&Error>) -> bool;
        fn purge_action(session: &Session; ctx ref) -> PurgeAction;
        fn purge_response_filter(
            session: &Session;
            ctx mut,
            purge_status: PurgeStatus,
            purge_response: &mut std::borrow::Cow<'static, ResponseHeader>
        ) -> Result<()>;
        fn persist_connection_context(session: &Session; ctx ref)
            -> Option<Box<dyn Any + Send + Sync>>;
        fn on_connection_reuse(session: &mut Session; ctx mut, prev_ctx: Box<dyn Any + Send + Sync>);
    }
}

/// The host of the standalone gateway: it claims nothing, so every request is the gateway's
/// ([`Mount::All`]) and none of these callbacks is reached.
pub(crate) struct NoHost;

#[async_trait]
impl ProxyHttp for NoHost {
    type CTX = ();

    fn new_ctx(&self) -> Self::CTX {}

    /// No downstream modules: we never compress, and each module costs every request.
    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Err(Error::explain(
            ErrorType::InternalError,
            "no host proxy behind the standalone gateway",
        ))
    }
}
