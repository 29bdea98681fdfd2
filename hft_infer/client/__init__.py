"""The typed Python client of hft-infer: publish a feed, read the decisions.

    from hft_infer.client import DecisionSubscriber, FeedPublisher

`FeedPublisher` sends Quotes, Trades, Heartbeats and Resets with the framing,
per-instrument sequence numbers and send timestamps done for the caller;
`DecisionSubscriber` yields typed `Decision`s (from Decision or DecisionBatch
frames) and `ServiceStatus`es (restarts and stops made explicit), blocking or in
asyncio. Both speak README.md's wire schema and nothing else, so a client in
another language that follows the README is their equal. README.md, *Python
client*, has an example of each.
"""

from hft_infer.client.endpoints import ServiceEndpoints, service_endpoints
from hft_infer.client.publisher import FeedPublisher
from hft_infer.client.subscriber import (
    DecisionSubscriber,
    EgressModeError,
    ServiceStatus,
    SubscriberStats,
)
from hft_infer.transport.curve import CurveKeyError
from hft_infer.transport.schema import Decision, Outcome, Reason, Status
from hft_infer.transport.sockets import EndpointError

__all__ = [
    "CurveKeyError",
    "Decision",
    "DecisionSubscriber",
    "EgressModeError",
    "EndpointError",
    "FeedPublisher",
    "Outcome",
    "Reason",
    "ServiceEndpoints",
    "ServiceStatus",
    "Status",
    "SubscriberStats",
    "service_endpoints",
]
