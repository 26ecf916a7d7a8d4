package bootstrap

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/dowse-dev/dowse/internal/link/pki"
)

const (
	// CACertConfigMapName is the ConfigMap (in the controller's namespace)
	// that publishes the link CA's certificate, never its key: the chart's
	// agents mount it and pin the CA.
	CACertConfigMapName = "dowse-link-ca-cert"
	// CACertKey is the certificate's key in that ConfigMap.
	CACertKey = "ca.crt"
)

// CACertPublisher keeps the CA's certificate in CACertConfigMapName: the
// CA is made by the controller (LoadOrCreateCA), not by the chart, so its
// key stays out of Helm's release history. It watches the ConfigMap and
// puts it back when it is deleted or changed (a chart upgrade drops the
// ConfigMap an earlier chart made).
type CACertPublisher struct {
	ConfigMaps typedcorev1.ConfigMapInterface
	CA         *pki.CA
	// Retry is the wait after a failed write or watch (ten seconds when
	// zero).
	Retry time.Duration
}

// Start publishes, then watches the ConfigMap and publishes again on each
// change, until ctx ends. A failure is logged and tried again: the link
// works without the ConfigMap for every agent that holds the CA already.
func (p *CACertPublisher) Start(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithValues("configMap", CACertConfigMapName)
	retry := p.Retry
	if retry <= 0 {
		retry = 10 * time.Second
	}
	for ctx.Err() == nil {
		if err := p.watch(ctx); err != nil && ctx.Err() == nil {
			log.Error(err, "publishing the link CA's certificate; agents that mount it wait for it", "retryIn", retry)
			select {
			case <-ctx.Done():
			case <-time.After(retry):
			}
		}
	}
	return nil
}

// watch publishes, then again at each event of the ConfigMap until the
// watch ends (the API server ends watches every few minutes).
func (p *CACertPublisher) watch(ctx context.Context) error {
	if err := p.Publish(ctx); err != nil {
		return err
	}
	w, err := p.ConfigMaps.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", CACertConfigMapName).String()})
	if err != nil {
		return fmt.Errorf("watching configmap %s: %w", CACertConfigMapName, err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if ev.Type == watch.Error {
			return fmt.Errorf("watching configmap %s: %w", CACertConfigMapName, apierrors.FromObject(ev.Object))
		}
		if err := p.Publish(ctx); err != nil {
			return err
		}
	}
	return nil
}

// Publish creates the ConfigMap, or puts the CA's certificate back in it
// when it holds another.
func (p *CACertPublisher) Publish(ctx context.Context) error {
	cm, err := p.ConfigMaps.Get(ctx, CACertConfigMapName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		cm = &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: CACertConfigMapName, Labels: map[string]string{"app.kubernetes.io/part-of": "dowse"}},
			Data:       map[string]string{CACertKey: string(p.CA.CertPEM)},
		}
		if _, err := p.ConfigMaps.Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating configmap %s: %w", CACertConfigMapName, err)
		}
		logr.FromContextOrDiscard(ctx).Info("published the link CA's certificate", "configMap", CACertConfigMapName, "pin", pki.CAPin(p.CA.Cert))
		return nil
	case err != nil:
		return fmt.Errorf("reading configmap %s: %w", CACertConfigMapName, err)
	case bytes.Equal([]byte(cm.Data[CACertKey]), p.CA.CertPEM):
		return nil
	}
	cm = cm.DeepCopy()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[CACertKey] = string(p.CA.CertPEM)
	if _, err := p.ConfigMaps.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating configmap %s: %w", CACertConfigMapName, err)
	}
	logr.FromContextOrDiscard(ctx).Info("put the link CA's certificate back in its configmap", "configMap", CACertConfigMapName)
	return nil
}
