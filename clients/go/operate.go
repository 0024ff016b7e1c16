package ferrymq

import "context"

// The operator's requests, protocol version 3: against a broker that speaks version 2 they
// fail with a *VersionError (matching ErrUnknownOpcode) without being sent.

// v3Request sends a version 3 request on the main connection.
func v3Request[T Payload](ctx context.Context, c *Client, name string, p Payload) (T, error) {
	var zero T
	k, err := c.conn(ctx)
	if err != nil {
		return zero, err
	}
	if k.hello.Version < 3 {
		return zero, &VersionError{Request: name, Need: 3, Have: k.hello.Version}
	}
	ans, err := k.roundTrip(ctx, p)
	if err != nil {
		return zero, err
	}
	return answerAs[T](p, ans)
}

// PurgeTopic drops every message a topic retains, for every subscription (subscriptions and
// consumers stay), and returns how many it retained. Needs the manage action on the topic.
func (c *Client) PurgeTopic(ctx context.Context, topic string) (uint64, error) {
	r, err := v3Request[*Purged](ctx, c, "PURGE_TOPIC", &PurgeTopic{Name: topic})
	if err != nil {
		return 0, err
	}
	return r.Messages, nil
}

// PauseSubscription stops deliveries to every consumer of a subscription (messages wait in its
// backlog; in-flight ones can still be settled) until ResumeSubscription.
func (c *Client) PauseSubscription(ctx context.Context, topic, subscription string) error {
	_, err := v3Request[*OK](ctx, c, "PAUSE_SUBSCRIPTION", &PauseSubscription{Topic: topic, Subscription: subscription, Paused: true})
	return err
}

// ResumeSubscription resumes a paused subscription's deliveries.
func (c *Client) ResumeSubscription(ctx context.Context, topic, subscription string) error {
	_, err := v3Request[*OK](ctx, c, "PAUSE_SUBSCRIPTION", &PauseSubscription{Topic: topic, Subscription: subscription})
	return err
}

// ListConnections returns one page of the broker's open connections (monitor or admin role):
// those with ids above after (0: the first page), at most limit (1..=1000). The page's
// NextAfter is the after of the next page, 0 on the last.
func (c *Client) ListConnections(ctx context.Context, after uint64, limit uint32) (*ConnectionList, error) {
	return v3Request[*ConnectionList](ctx, c, "LIST_CONNECTIONS", &ListConnections{After: after, Limit: limit})
}

// CloseConnection closes a connection of the broker (admin role); its consumers' in-flight
// messages go back to their subscriptions.
func (c *Client) CloseConnection(ctx context.Context, id uint64) error {
	_, err := v3Request[*OK](ctx, c, "CLOSE_CONNECTION", &CloseConnection{ID: id})
	return err
}
