package readings

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

// APIServices is apiregistration.k8s.io/v1's resource.
var APIServices = schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}

// CABundleKeeper keeps an APIService's caBundle at the CA that signs the
// readings API's serving certificates (the link CA, which the controller
// makes: the chart cannot know it), so that the API server verifies the
// replicas rather than skipping TLS verification. An APIService that does
// not exist (the chart did not register the API) is looked for again
// every minute.
type CABundleKeeper struct {
	Client dynamic.Interface
	Name   string
	CAPEM  []byte
	Log    logr.Logger
}

// Start keeps the caBundle until ctx ends.
func (k *CABundleKeeper) Start(ctx context.Context) error {
	for {
		next := time.Minute
		found, err := k.Keep(ctx)
		if err != nil && ctx.Err() == nil {
			k.Log.Error(err, "setting the readings APIService's caBundle", "apiService", k.Name)
		}
		if !found || err != nil {
			// Registered soon after the controller starts, maybe.
			next = 5 * time.Second
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(next):
		}
	}
}

// Keep sets the caBundle once if it differs; found says whether the
// APIService exists.
func (k *CABundleKeeper) Keep(ctx context.Context) (found bool, err error) {
	u, err := k.Client.Resource(APIServices).Get(ctx, k.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	cur, _, _ := unstructuredString(u.Object, "spec", "caBundle")
	if b, err := base64.StdEncoding.DecodeString(cur); err == nil && bytes.Equal(b, k.CAPEM) {
		return true, nil
	}
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"caBundle": base64.StdEncoding.EncodeToString(k.CAPEM), "insecureSkipTLSVerify": false}})
	_, err = k.Client.Resource(APIServices).Patch(ctx, k.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "dowse-controller"})
	if err == nil {
		k.Log.Info("set the readings APIService's caBundle to the link CA", "apiService", k.Name)
	}
	return true, err
}

func unstructuredString(obj map[string]any, path ...string) (string, bool, error) {
	var cur any = obj
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return "", false, nil
		}
		cur = m[p]
	}
	s, ok := cur.(string)
	return s, ok, nil
}
