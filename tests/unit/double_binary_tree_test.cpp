// The two trees of the double binary tree all_reduce (collectives/double_binary_tree.h): each spans every rank
// once with consistent parent / child links, its depth is the in-order tree's ceil(log2(p + 1)) - 1, and no rank
// is interior in both (the property that keeps every rank's traffic O(S)). Checked for every p up to 1100.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "collectives/double_binary_tree.h"

using shardsim::collectives::double_binary_tree::node;
using shardsim::collectives::double_binary_tree::TreeNode;

namespace {

int depth_of(int tree, int r, int p) {
  int d = 0;
  for (int x = node(tree, r, p).parent; x >= 0; x = node(tree, x, p).parent) ++d;
  return d;
}

}  // namespace

TEST(DoubleBinaryTree, TreesSpanEveryRankAndLinksAgree) {
  for (int p = 1; p <= 1100; ++p) {
    for (int tree = 0; tree < 2; ++tree) {
      int roots = 0, max_depth = 0;
      std::vector<int> parent_count(static_cast<size_t>(p), 0);
      for (int r = 0; r < p; ++r) {
        const TreeNode n = node(tree, r, p);
        roots += n.parent < 0;
        for (int c = 0; c < n.n_children(); ++c) {
          ASSERT_GE(n.children[c], 0) << "p " << p << " tree " << tree << " rank " << r;
          ASSERT_LT(n.children[c], p);
          ASSERT_EQ(node(tree, n.children[c], p).parent, r) << "p " << p << " tree " << tree << " rank " << r;
          ++parent_count[static_cast<size_t>(n.children[c])];
        }
        if (n.parent >= 0) max_depth = std::max(max_depth, depth_of(tree, r, p));
      }
      ASSERT_EQ(roots, 1) << "p " << p << " tree " << tree;
      for (int r = 0; r < p; ++r) ASSERT_EQ(parent_count[static_cast<size_t>(r)], node(tree, r, p).parent >= 0 ? 1 : 0);
      // In-order tree over 1..p: depth ceil(log2(p + 1)) - 1 (a complete tree's), never deeper.
      EXPECT_LE(max_depth, static_cast<int>(std::ceil(std::log2(p + 1.0))) - 1) << "p " << p << " tree " << tree;
    }
    for (int r = 0; r < p; ++r)
      ASSERT_FALSE(node(0, r, p).n_children() > 0 && node(1, r, p).n_children() > 0)
          << "p " << p << ": rank " << r << " is interior in both trees";
  }
}

TEST(DoubleBinaryTree, SmallTreesByHand) {
  // p = 6, tree A over positions 1..6 (rank + 1): root 4; left [1,3] -> 2 (children 1, 3); right [5,6] -> 6
  // (child 5). In ranks: root 3; 1 -> {0, 2}; 5 -> {4}.
  EXPECT_EQ(node(0, 3, 6).parent, -1);
  EXPECT_EQ(node(0, 1, 6).parent, 3);
  EXPECT_EQ(node(0, 5, 6).parent, 3);
  EXPECT_EQ(node(0, 0, 6).parent, 1);
  EXPECT_EQ(node(0, 4, 6).parent, 5);
  EXPECT_EQ(node(0, 1, 6).children[0], 0);
  EXPECT_EQ(node(0, 1, 6).children[1], 2);
  // Tree B: position = rank, rank 0 at position 6: root is rank 4; rank 0 (position 6) has child rank 5.
  EXPECT_EQ(node(1, 4, 6).parent, -1);
  EXPECT_EQ(node(1, 5, 6).parent, 0);
  // p = 2: each rank is the root of one tree and the other's leaf.
  EXPECT_EQ(node(0, 1, 2).parent, -1);
  EXPECT_EQ(node(0, 0, 2).parent, 1);
  EXPECT_EQ(node(1, 0, 2).parent, -1);
  EXPECT_EQ(node(1, 1, 2).parent, 0);
}
