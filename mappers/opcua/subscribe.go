package opcua

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/ua"

	"github.com/dowse-dev/dowse/mappers/mapper"
)

// Subscribe creates one subscription with a monitored item per property;
// each data change is pushed until ctx ends.
func (d *Driver) Subscribe(ctx context.Context, ps []*mapper.Property, push func(*mapper.Property, any, error)) error {
	if d.client == nil {
		return fmt.Errorf("%w: not connected", mapper.ErrDisconnected)
	}
	ch := make(chan *opcua.PublishNotificationData, 64)
	sub, err := d.client.Subscribe(ctx, &opcua.SubscriptionParameters{Interval: d.cfg.publishing}, ch)
	if err != nil {
		return d.classify(err, "creating a subscription")
	}
	byHandle := map[uint32]*mapper.Property{}
	var items []*ua.MonitoredItemCreateRequest
	for i, p := range ps {
		pt := p.Data.(*point)
		pt.handle = uint32(i + 1)
		byHandle[pt.handle] = p
		item := opcua.NewMonitoredItemCreateRequestWithDefaults(pt.id, ua.AttributeIDValue, pt.handle)
		if pt.sample > 0 {
			item.RequestedParameters.SamplingInterval = float64(pt.sample.Milliseconds())
		}
		items = append(items, item)
	}
	res, err := sub.Monitor(ctx, ua.TimestampsToReturnBoth, items...)
	if err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = sub.Cancel(cctx)
		return d.classify(err, "monitoring nodes")
	}
	// Items the server refused (a node it does not have yet, say) are
	// asked for again with backoff while the others report.
	var retry []*ua.MonitoredItemCreateRequest
	var retryProps []*mapper.Property
	refused := func(res *ua.CreateMonitoredItemsResponse, asked []*ua.MonitoredItemCreateRequest, props []*mapper.Property) {
		retry, retryProps = retry[:0], retryProps[:0]
		for i, r := range res.Results {
			if bad(r.StatusCode) && i < len(props) {
				push(props[i], nil, d.classify(r.StatusCode, "monitoring "+props[i].Data.(*point).id.String()))
				retry, retryProps = append(retry, asked[i]), append(retryProps, props[i])
			}
		}
	}
	refused(res, items, ps)
	go func() {
		defer func() {
			// ctx has ended; the cancel call gets a moment of its own.
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer cancel()
			_ = sub.Cancel(cctx)
		}()
		wait := time.Second
		again := time.NewTimer(wait)
		defer again.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-again.C:
				if len(retry) > 0 {
					asked, props := slices.Clone(retry), slices.Clone(retryProps)
					if res, err := sub.Monitor(ctx, ua.TimestampsToReturnBoth, asked...); err == nil {
						refused(res, asked, props)
					}
					wait = min(2*wait, 30*time.Second)
				}
				again.Reset(wait)
			case msg := <-ch:
				if msg == nil {
					continue
				}
				if msg.Error != nil {
					for _, p := range ps {
						push(p, nil, d.classify(msg.Error, "subscription"))
					}
					continue
				}
				dc, ok := msg.Value.(*ua.DataChangeNotification)
				if !ok {
					continue
				}
				for _, item := range dc.MonitoredItems {
					p := byHandle[item.ClientHandle]
					if p == nil {
						continue
					}
					v, err := d.value(p.Data.(*point), item.Value)
					push(p, v, err)
				}
			}
		}
	}()
	return nil
}
