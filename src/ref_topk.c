/* ref_topk.c: which k of n values torch.topk keeps on the CPU, ties included
 * (ref_topk_torch in ref_model.h).
 *
 * The DSA indexer's scores are sums of ReLU'd head scores, so a key whose
 * every head score is negative scores exactly 0, and several such keys can
 * straddle the top-k boundary.  Which of those equal keys transformers
 * attends to is decided by torch.topk, whose CPU kernel (ATen's
 * topk_impl_loop) fills an array of (value, index) pairs in index order and
 * runs std::nth_element on it (std::partial_sort when k * 64 <= n) with the
 * comparison "a before b if a is NaN and b is not, or a > b".  Those
 * algorithms are not stable: the tie winners depend on the pivots they
 * happen to choose.  A reference that broke ties by index disagreed with
 * transformers whenever such a tie fell on the boundary (issue
 * [fidelity-sweep]): the attended set differs, and from there the logits.
 *
 * So this file performs the same steps on the same array: libstdc++'s
 * introselect (median-of-three pivot moved to the front, unguarded Hoare
 * partition, heap select when the depth budget 2 * floor(log2 n) runs out,
 * insertion sort below four elements) and its heap select (binary max-heap
 * in the comparison's order, built bottom-up; each later element that
 * compares before the root replaces it).  Only the set of the first k
 * survivors matters to the callers, so the final sort is not performed.
 * The algorithms are described, not copied, from the C++ standard library's
 * documented behaviour; tests/test_fidelity.c checks the chosen sets against
 * transformers' own top-k indices.
 */
#include <math.h>
#include <stdlib.h>

#include "ref_model.h"
#include "util.h"

typedef struct {
  float v;
  int64_t i;
} tk_elem;

/* The comparison torch passes for largest = true: a goes before b. */
static int tk_before(const tk_elem *a, const tk_elem *b) {
  return (isnan(a->v) && !isnan(b->v)) || a->v > b->v;
}

static void tk_swap(tk_elem *a, tk_elem *b) {
  tk_elem t = *a;
  *a = *b;
  *b = t;
}

/* Move the hole at `hole` up towards `top` until its parent no longer
 * goes after val, then drop val there. */
static void tk_push_heap(tk_elem *h, int64_t hole, int64_t top, tk_elem val) {
  int64_t parent = (hole - 1) / 2;
  while (hole > top && tk_before(&h[parent], &val)) {
    h[hole] = h[parent];
    hole = parent;
    parent = (hole - 1) / 2;
  }
  h[hole] = val;
}

/* Sift: walk the hole down to a leaf along the larger children, then push
 * val back up from there. */
static void tk_adjust_heap(tk_elem *h, int64_t hole, int64_t len, tk_elem val) {
  int64_t top = hole, child = hole;
  while (child < (len - 1) / 2) {
    child = 2 * (child + 1);
    if (tk_before(&h[child], &h[child - 1])) child--;
    h[hole] = h[child];
    hole = child;
  }
  if ((len & 1) == 0 && child == (len - 2) / 2) {
    child = 2 * (child + 1);
    h[hole] = h[child - 1];
    hole = child - 1;
  }
  tk_push_heap(h, hole, top, val);
}

static void tk_make_heap(tk_elem *h, int64_t len) {
  if (len < 2) return;
  for (int64_t parent = (len - 2) / 2;; parent--) {
    tk_adjust_heap(h, parent, len, h[parent]);
    if (parent == 0) return;
  }
}

/* After this, a[0..mid) holds mid elements none of which goes after any
 * element of a[mid..n). */
static void tk_heap_select(tk_elem *a, int64_t mid, int64_t n) {
  tk_make_heap(a, mid);
  for (int64_t i = mid; i < n; i++)
    if (tk_before(&a[i], &a[0])) {
      tk_elem val = a[i];
      a[i] = a[0];
      tk_adjust_heap(a, 0, mid, val);
    }
}

static void tk_insertion_sort(tk_elem *a, int64_t n) {
  for (int64_t i = 1; i < n; i++) {
    tk_elem val = a[i];
    if (tk_before(&val, &a[0])) {
      for (int64_t j = i; j > 0; j--) a[j] = a[j - 1];
      a[0] = val;
    } else {
      int64_t j = i;
      while (tk_before(&val, &a[j - 1])) {
        a[j] = a[j - 1];
        j--;
      }
      a[j] = val;
    }
  }
}

/* Put the median of a[1], a[mid], a[n-1] into a[0], then partition
 * a[1..n) around it; returns the cut. */
static int64_t tk_partition_pivot(tk_elem *a, int64_t n) {
  tk_elem *x = &a[1], *y = &a[n / 2], *z = &a[n - 1];
  if (tk_before(x, y)) {
    if (tk_before(y, z)) tk_swap(a, y);
    else if (tk_before(x, z)) tk_swap(a, z);
    else tk_swap(a, x);
  } else if (tk_before(x, z)) tk_swap(a, x);
  else if (tk_before(y, z)) tk_swap(a, z);
  else tk_swap(a, y);
  int64_t lo = 1, hi = n;
  for (;;) {
    while (tk_before(&a[lo], &a[0])) lo++;
    hi--;
    while (tk_before(&a[0], &a[hi])) hi--;
    if (lo >= hi) return lo;
    tk_swap(&a[lo], &a[hi]);
    lo++;
  }
}

static int floor_log2(int64_t n) {
  int r = 0;
  while (n > 1) n >>= 1, r++;
  return r;
}

/* nth_element: afterwards a[nth] is the element a full sort would put
 * there, nothing before it goes after it and nothing after it before it. */
static void tk_nth_element(tk_elem *a, int64_t nth, int64_t n) {
  int depth = 2 * floor_log2(n);
  int64_t first = 0, last = n;
  while (last - first > 3) {
    if (depth == 0) {
      tk_heap_select(a + first, nth - first + 1, last - first);
      tk_swap(&a[first], &a[nth]);
      return;
    }
    depth--;
    int64_t cut = first + tk_partition_pivot(a + first, last - first);
    if (cut <= nth) first = cut;
    else last = cut;
  }
  tk_insertion_sort(a + first, last - first);
}

void ref_topk_torch(const float *v, int64_t n, int64_t k, int64_t *idx) {
  MJ_ASSERT(k >= 1 && k <= n);
  tk_elem *a = mj_xmalloc((size_t)n * sizeof *a);
  for (int64_t i = 0; i < n; i++) a[i] = (tk_elem){v[i], i};
  if (k * 64 <= n) tk_heap_select(a, k, n); /* std::partial_sort's selection */
  else tk_nth_element(a, k - 1, n);
  for (int64_t i = 0; i < k; i++) idx[i] = a[i].i;
  free(a);
}
