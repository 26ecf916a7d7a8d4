package kube

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Watch tells handle of every change to the objects of list's kind in
// namespace until ctx ends, each in order. It lists them first (handle
// gets each as Added) and watches from the list's resourceVersion, not
// from nothing: a watch from nothing starts with an event per object, and
// a busy API server drops a watcher slow to take them. When the watch
// ends it resumes from the last resourceVersion seen, and lists again
// when that is too old. handle runs on Watch's goroutine.
func Watch(ctx context.Context, c client.WithWatch, list client.ObjectList, namespace string, handle func(watch.EventType, client.Object)) error {
	rv := ""
	relist := func() error {
		if err := c.List(ctx, list, client.InNamespace(namespace)); err != nil {
			return err
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			return err
		}
		for _, o := range items {
			if obj, ok := o.(client.Object); ok {
				handle(watch.Added, obj)
			}
		}
		rv = list.GetResourceVersion()
		return nil
	}
	if err := relist(); err != nil {
		return err
	}
	for ctx.Err() == nil {
		w, err := c.Watch(ctx, list, &client.ListOptions{Namespace: namespace, Raw: &metav1.ListOptions{ResourceVersion: rv}})
		if err != nil {
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				err = relist()
			}
			if err != nil && ctx.Err() == nil {
				time.Sleep(100 * time.Millisecond)
			}
			continue
		}
		for ev := range w.ResultChan() {
			if ev.Type == watch.Error {
				// Most likely too old a resourceVersion: list again.
				if err := relist(); err != nil && ctx.Err() == nil {
					time.Sleep(100 * time.Millisecond)
				}
				break
			}
			obj, ok := ev.Object.(client.Object)
			if !ok {
				continue
			}
			if ev.Type != watch.Bookmark {
				handle(ev.Type, obj)
			}
			rv = obj.GetResourceVersion()
		}
		w.Stop()
	}
	return nil
}
