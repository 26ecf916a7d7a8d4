package controller

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// LabelCloudhub marks the controller replica that runs the cloudhub (the
// leader: only it serves the link), so that the link's Service selects it
// alone and edges never dial a replica that is not listening.
const LabelCloudhub = "dowse.dev/cloudhub"

// hubLabel keeps LabelCloudhub=leader on this replica's own Pod while it
// leads and takes it off when it stops. A replica that lost the lease exits
// (controller-runtime's rule), and its restarted container clears the
// label before it competes again (clear, from Run).
type hubLabel struct {
	pods corev1client.PodInterface
	name string
	log  logr.Logger
}

func (h hubLabel) set(ctx context.Context, on bool) error {
	v := "null"
	if on {
		v = `"leader"`
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, LabelCloudhub, v)
	_, err := h.pods.Patch(ctx, h.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// clear takes the label off, best effort: a Pod left labelled by a
// container that died as leader would otherwise get edges.
func (h hubLabel) clear(ctx context.Context) {
	if err := h.set(ctx, false); err != nil {
		h.log.Error(err, "clearing this pod's cloudhub label", "pod", h.name)
	}
}

// Start labels the Pod, retrying until it succeeds, and unlabels it when
// ctx ends.
func (h hubLabel) Start(ctx context.Context) error {
	for {
		err := h.set(ctx, true)
		if err == nil {
			h.log.Info("labelled this pod as the cloudhub's", "pod", h.name)
			break
		}
		h.log.Error(err, "labelling this pod as the cloudhub's; retrying", "pod", h.name)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(5 * time.Second):
		}
	}
	<-ctx.Done()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	h.clear(cctx)
	return nil
}

// NeedLeaderElection: only the leader runs the cloudhub.
func (hubLabel) NeedLeaderElection() bool { return true }
